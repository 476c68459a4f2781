"""A team's secrets: ``GET/POST /teams/{id}/secrets`` and ``PUT/DELETE
/teams/{id}/secrets/{name}``. Names, versions and who set them are shown; a value is written
and never read back (only the agents running the team's replicas receive it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import api_view, permission_classes
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.allocations.secrets import (
    SecretRoll,
    team_secret_create,
    team_secret_delete,
    team_secret_roll,
    team_secret_set,
)
from fleet.api.common import error_responses, parse_id
from fleet.api.permissions import authorize_team_secrets
from fleet.api.resources.secrets.serializers import (
    SecretCreateSerializer,
    SecretSerializer,
    SecretSetSerializer,
    SecretUpdateSerializer,
)
from fleet.core.errors import ServiceError
from fleet.core.models import TeamSecret
from fleet.core.permissions import AnyRole
from fleet.core.secrets import secret_as_dict
from fleet.core.teams import team_get


def _body(request: Request, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(request.data, Mapping):
        raise ServiceError("malformed_request", "The body must be a JSON object.")
    unknown = sorted(str(key)[:64] for key in request.data if key not in allowed)
    if unknown:
        raise ServiceError(
            "secret.field_unknown",
            f"Unknown field {unknown[0]!r}; the fields are {', '.join(sorted(allowed))}.",
            {"fields": unknown[:8]},
        )
    return request.data


@extend_schema(
    methods=["GET"],
    responses={200: SecretSerializer(many=True), **error_responses(401, 403, 404)},
    description="The team's secrets, by name: version, who set the value and when, never the "
    "value. The team's members and fleet viewers and up.",
)
@extend_schema(
    methods=["POST"],
    request=SecretCreateSerializer,
    responses={201: SecretSerializer, **error_responses(400, 401, 403, 404, 409)},
    description='`{"name": "hf-token", "value": "…"}`: a new secret of the team (its operators, '
    "and fleet operators and up), encrypted at rest; 409 `secret.exists` when the name is "
    'taken. A workload refers to it as `"env": {"HF_TOKEN": {"secret": "hf-token"}}`: only '
    "the agents running the team's replicas receive the value. Audited as a `set_secret` "
    "operation (name and version, never the value).",
)
@api_view(["GET", "POST"])
@permission_classes([AnyRole])
def team_secrets(request: Request, pk: int) -> Response:
    team = team_get(parse_id(pk))
    authorize_team_secrets(request, team)
    if request.method == "POST":
        body = _body(request, {"name", "value"})
        secret = team_secret_create(
            team_id=team.pk,
            name=body.get("name"),
            value=body.get("value"),
            requested_by=request.user,
        )
        return Response(secret_as_dict(secret), status=status.HTTP_201_CREATED)
    secrets = TeamSecret.objects.filter(team=team).select_related("updated_by").order_by("name")
    return Response([secret_as_dict(s) for s in secrets])


@extend_schema(
    methods=["PUT"],
    request=SecretUpdateSerializer,
    responses={200: SecretSetSerializer, **error_responses(400, 401, 403, 404)},
    description='`{"value": "…", "roll": false}`: a new value, the next version. Replicas '
    "already running keep theirs until they restart or move; with `roll: true` every "
    "deployment of the team that refers to the secret starts a rolling update (listed in "
    "`rollouts`; one that cannot roll now is in `skipped`, with why). Audited as a "
    "`set_secret` operation.",
)
@extend_schema(
    methods=["DELETE"],
    responses={204: None, **error_responses(401, 403, 404, 409)},
    description="Delete the secret: 409 `secret.in_use` while a deployment refers to it. "
    "Audited as a `delete_secret` operation.",
)
@api_view(["PUT", "DELETE"])
@permission_classes([AnyRole])
def team_secret(request: Request, pk: int, name: str) -> Response:
    team = team_get(parse_id(pk))
    authorize_team_secrets(request, team)
    if request.method == "DELETE":
        team_secret_delete(team_id=team.pk, name=name, requested_by=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
    body = _body(request, {"value", "roll"})
    roll = body.get("roll", False)
    if not isinstance(roll, bool):
        raise ServiceError("secret.roll_invalid", "'roll' is true or false.", {"field": "roll"})
    secret = team_secret_set(
        team_id=team.pk, name=name, value=body.get("value"), requested_by=request.user
    )
    rolled = (
        team_secret_roll(team_id=team.pk, name=secret.name, requested_by=request.user)
        if roll
        else SecretRoll()
    )
    return Response(
        {
            **secret_as_dict(secret),
            "rollouts": [{"deployment": d, "operation": o} for d, o in rolled.rollouts.items()],
            "skipped": [{"deployment": d, "reason": r} for d, r in rolled.skipped.items()],
        }
    )
