"""A team's policy: ``GET /teams/{id}/policy`` (every role: the effective policy, defaults
filled in) and ``PUT /teams/{id}/policy`` (fleet admins only: the whole policy)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.api.common import error_responses, parse_id
from fleet.api.permissions import require_fleet_admin
from fleet.api.resources.policies.serializers import PolicySerializer
from fleet.core.policy import (
    effective_policy,
    team_policy_set,
)
from fleet.core.teams import team_get


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
        require_fleet_admin(request.user, "Only fleet admins set a team's policy.")
        team_get(pk)
        team = team_policy_set(team_id=pk, policy=request.data, requested_by=request.user)
    else:
        team = team_get(pk)
    return Response(effective_policy(team.policy))
