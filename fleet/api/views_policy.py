"""A team's policy: ``GET /teams/{id}/policy`` (every role: the effective policy, defaults
filled in) and ``PUT /teams/{id}/policy`` (fleet admins only: the whole policy)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.api.common import error_responses, parse_id
from fleet.api.fields import BoundedListField
from fleet.core.policy import (
    MAX_MEMORY_MIB,
    MAX_PIDS,
    MAX_REGISTRIES,
    MAX_UID_RANGES,
    MIN_MEMORY_MIB,
    MIN_PIDS,
    RUNTIMES,
    SAFE_CAPABILITIES,
    effective_policy,
    team_policy_set,
)
from fleet.core.roles import Role, role_of
from fleet.core.teams import team_get


class PolicySerializer(serializers.Serializer[Any]):
    """For the schema: the services check the body (``policy.invalid`` names each bad key)."""

    runtimes = BoundedListField(
        child=serializers.ChoiceField(choices=[*RUNTIMES, "none"]),
        required=False,
        max_length=3,
        help_text='Workload runtimes the team may use (`none` always); default `["container"]`. '
        "`process` runs commands on the host itself: it needs `process_user`, and hosts "
        "whose agent was started with `--allow-process-runtime`.",
    )
    registries = BoundedListField(
        child=serializers.CharField(max_length=255),
        required=False,
        max_length=MAX_REGISTRIES,
        help_text="Image prefixes ending in `/` (`registry.example.com/team-a/`, "
        "`docker.io/library/`) or repositories (`docker.io/library/python`) a container's "
        "image must come from; `python:3.11` reads as `docker.io/library/python:3.11`. "
        "Default `[]`: any registry.",
    )
    uids = BoundedListField(
        child=BoundedListField(child=serializers.IntegerField(), min_length=2, max_length=2),
        required=False,
        max_length=MAX_UID_RANGES,
        help_text="`[[lo, hi], ...]`: the uids a workload's `user` may be (numeric `uid[:gid]` "
        "then); default `[[1000, 2147483647]]`; `[]`: any user but root.",
    )
    allow_root = serializers.BooleanField(
        required=False, help_text="uid 0 (`root`, `0:0`) may run; default false."
    )
    process_user = serializers.CharField(
        required=False,
        allow_null=True,
        max_length=64,
        help_text="The `uid[:gid]` every process workload runs as; required with the `process` "
        "runtime, non-root unless `allow_root`.",
    )
    capabilities = BoundedListField(
        child=serializers.ChoiceField(choices=sorted(SAFE_CAPABILITIES)),
        required=False,
        max_length=len(SAFE_CAPABILITIES),
        help_text="Linux capabilities added back after dropping all of them; default `[]`.",
    )
    max_host_memory_mib = serializers.IntegerField(
        required=False,
        min_value=MIN_MEMORY_MIB,
        max_value=MAX_MEMORY_MIB,
        help_text="The most host memory a deployment may ask for (`host_memory_mib`); "
        "default 65536.",
    )
    default_host_memory_mib = serializers.IntegerField(
        required=False,
        min_value=MIN_MEMORY_MIB,
        max_value=MAX_MEMORY_MIB,
        help_text="A replica's host memory limit when its deployment asks for none; default 16384.",
    )
    max_pids = serializers.IntegerField(
        required=False,
        min_value=MIN_PIDS,
        max_value=MAX_PIDS,
        help_text="Each replica's PID limit; default 4096.",
    )
    host_network = serializers.BooleanField(
        required=False,
        help_text="Containers use the host's network; default false.",
    )


@extend_schema(
    methods=["GET"],
    responses={200: PolicySerializer, **error_responses(401, 403, 404)},
    description="The team's effective policy: every key, those not set at their restricted "
    "defaults.",
)
@extend_schema(
    methods=["PUT"],
    request=PolicySerializer,
    responses={200: PolicySerializer, **error_responses(400, 401, 403, 404)},
    description="Fleet admins only: the team's whole policy (keys left out go back to their "
    "defaults; `{}` restricts the team again); answered with the effective policy. A bad key "
    "or value is a 400 `policy.invalid` whose `details.fields` names each. Deployments are "
    "checked against it from then on, on create, on a new workload and on a hand-over to the "
    "team (422 `policy.*`); running replicas are left alone. Audited as a `set_policy` "
    "operation with the previous and the new policy.",
)
@api_view(["GET", "PUT"])
def team_policy(request: Request, pk: int) -> Response:
    pk = parse_id(pk)
    if request.method == "PUT":
        if role_of(request.user) < Role.ADMIN:
            raise PermissionDenied("Only fleet admins set a team's policy.")
        team_get(pk)
        team = team_policy_set(team_id=pk, policy=request.data, requested_by=request.user)
    else:
        team = team_get(pk)
    return Response(effective_policy(team.policy))
