"""``/teams/``: admins create, rename, delete teams and set their members and quotas; every role
reads them (a team's quota next to what it holds now)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.allocations.quotas import team_usage
from fleet.api.common import error_responses, parse_id
from fleet.api.resources.teams.serializers import MembersSerializer, QuotaSerializer, TeamSerializer
from fleet.core.errors import ServiceError
from fleet.core.models import Team
from fleet.core.roles import Role
from fleet.core.teams import (
    members_of,
    quota_as_dict,
    team_create,
    team_delete,
    team_members_set,
    team_quota_set,
    team_update,
)


def team_body(team: Team) -> dict[str, Any]:
    return {
        "id": team.pk,
        "name": team.name,
        "slug": team.slug,
        "members": [
            {"user": m.user_id, "username": m.user.get_username(), "role": m.role}
            for m in members_of(team)
        ],
        "quota": quota_as_dict(team),
        "usage": team_usage(team.pk).as_dict(),
        "deployments": team.deployments.count(),
        "default_priority": team.default_priority,
    }


def _body(request: Request) -> Mapping[str, Any]:
    if not isinstance(request.data, Mapping):
        raise ServiceError("malformed_request", "The body must be a JSON object.")
    return request.data


@extend_schema_view(
    list=extend_schema(
        responses={200: TeamSerializer(many=True), **error_responses(400, 401, 403, 404, 409)}
    ),
    retrieve=extend_schema(
        responses={200: TeamSerializer, **error_responses(400, 401, 403, 404, 409)}
    ),
)
class TeamViewSet(viewsets.GenericViewSet[Team]):
    """Teams own deployments. Every role reads them; admins write (create, rename, delete, set
    members and quotas)."""

    lookup_value_regex = r"[0-9]+"
    serializer_class = TeamSerializer
    filterset_class = None
    required_roles = dict.fromkeys(
        ("create", "partial_update", "destroy", "members", "quota"), Role.ADMIN
    )

    def get_queryset(self) -> QuerySet[Team]:
        return Team.objects.order_by("name")

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        teams = page if page is not None else list(self.get_queryset())
        body = [team_body(team) for team in teams]
        return self.get_paginated_response(body) if page is not None else Response(body)

    def retrieve(self, request: Request, pk: str | None = None) -> Response:
        return Response(team_body(self.get_object()))

    @extend_schema(
        request=TeamSerializer,
        responses={201: TeamSerializer, **error_responses(400, 401, 403, 404, 409)},
    )
    def create(self, request: Request) -> Response:
        body = _body(request)
        team = team_create(name=body.get("name"), slug=body.get("slug"), requested_by=request.user)
        return Response(team_body(team), status=status.HTTP_201_CREATED)

    @extend_schema(
        request=TeamSerializer,
        responses={200: TeamSerializer, **error_responses(400, 401, 403, 404, 409)},
    )
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        team = team_update(team_id=parse_id(pk), changes=_body(request), requested_by=request.user)
        return Response(team_body(team))

    @extend_schema(
        responses={204: None, **error_responses(400, 401, 403, 404, 409)},
        description="Delete an empty team (409 `team.not_empty`; `default` stays: 409).",
    )
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        team_delete(team_id=parse_id(pk), requested_by=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=MembersSerializer,
        responses={200: TeamSerializer, **error_responses(400, 401, 403, 404, 409)},
        description='`{"members": [{"user": 7, "role": "operator"}]}`: exactly these members '
        "(those not listed leave the team). `viewer` reads; `operator` creates, places, moves, "
        "scales and deletes the team's deployments.",
    )
    @action(detail=True, methods=["put"])
    def members(self, request: Request, pk: str | None = None) -> Response:
        team = team_members_set(
            team_id=parse_id(pk), members=_body(request).get("members"), requested_by=request.user
        )
        return Response(team_body(team))

    @extend_schema(
        request=QuotaSerializer,
        responses={200: TeamSerializer, **error_responses(400, 401, 403, 404, 409)},
        description='Any of `{"gpus": 4, "mig_compute_slices": 14, "mps_memory_mib": 65536, '
        '"mig_profiles": {"1g.10gb": 8}}` (the deserved share), `"limit": {...}` (the same kinds: '
        'the most it may hold, borrowing included) and `"over_quota_weight": 2`; what is not '
        "given stays, `null` lifts it; a limit below its deserved share: 400 `quota.invalid`. "
        "Enforced in the transaction that places a replica (place, auto-placement, scale, "
        "rolling update): a replica past a limit is refused with 422 `quota.exceeded`. A "
        "limit below what the team holds evicts nothing. Moves: the team's first move in "
        "flight is its one surge replica; every other move's new copy counts until its move "
        "ends, and a move it does not fit is refused. The fleet's own moves (drains, "
        "maintenance, repack, defragmentation) and a fault's re-placement may pass it, each "
        "recorded as an `over_quota` operation.",
    )
    @action(detail=True, methods=["put"])
    def quota(self, request: Request, pk: str | None = None) -> Response:
        team = team_quota_set(team_id=parse_id(pk), quota=_body(request), requested_by=request.user)
        return Response(team_body(team))
