"""Teams: admins create, rename, delete teams and set their members and quotas; every role
reads them (a team's quota next to what it holds now). Also the team checks of the deployment
endpoints: a user without the fleet operator role acts only on its own teams' deployments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.quotas import team_usage
from fleet.api.common import parse_id
from fleet.api.fields import BoundedDictField, BoundedListField, IdField
from fleet.api.serializers import ErrorSerializer
from fleet.core.errors import ServiceError
from fleet.core.models import Team, TeamRole
from fleet.core.roles import Role
from fleet.core.teams import (
    MAX_MEMBERS,
    MAX_PROFILES,
    can_operate_team,
    can_see_spec,
    default_team_for,
    members_of,
    quota_as_dict,
    team_create,
    team_delete,
    team_members_set,
    team_quota_set,
    team_update,
)

ERRORS = {
    code: OpenApiResponse(ErrorSerializer, description=text)
    for code, text in {
        400: "Malformed or invalid input",
        401: "Not authenticated",
        403: "Role too low",
        404: "Not found",
        409: "Conflicts with the current state",
    }.items()
}


def authorize_deployment(user: Any, deployment_id: int) -> None:
    """403 unless the user may act on the deployment's team (a missing one: the service 404s)."""
    team_id = Deployment.objects.filter(pk=deployment_id).values_list("team_id", flat=True).first()
    if team_id is not None and not can_operate_team(user, team_id):
        raise PermissionDenied("Only the operators of this deployment's team may change it.")


def authorize_allocation(user: Any, allocation_id: int) -> None:
    team_id = (
        Allocation.objects.filter(pk=allocation_id)
        .values_list("deployment__team_id", flat=True)
        .first()
    )
    if team_id is not None and not can_operate_team(user, team_id):
        raise PermissionDenied("Only the operators of this replica's team may move it.")


def authorize_replica_read(user: Any, allocation_id: int) -> None:
    """403 unless the user may read what the replica runs, prints and uses (its logs, its
    metrics): its team's members and fleet viewers and up (a missing one: the caller 404s)."""
    team_id = (
        Allocation.objects.filter(pk=allocation_id)
        .values_list("deployment__team_id", flat=True)
        .first()
    )
    if team_id is not None and not can_see_spec(user, team_id):
        raise PermissionDenied(
            "Only the members of this replica's team and fleet viewers read its logs and metrics."
        )


def team_for_create(user: Any, named: str | None) -> int:
    """The team a new deployment joins: the one named (id or slug; the user must operate it),
    else the user's only team (``default`` for a fleet operator)."""
    if named is None:
        return default_team_for(user)
    by_id = named.isdecimal() and len(named) <= 18  # past that, no id: a slug
    found = Team.objects.filter(pk=int(named)) if by_id else Team.objects.filter(slug=named)
    team_id = found.values_list("pk", flat=True).first()
    if team_id is None:  # a field of the body, not the resource asked for: 400, not 404
        raise ServiceError("team.not_found", f"Team {named!r} does not exist.", {"team": named})
    if not can_operate_team(user, team_id):
        raise PermissionDenied("Only the team's operators create its deployments.")
    return team_id


class MemberSerializer(serializers.Serializer[Any]):
    user = IdField()
    username = serializers.CharField(read_only=True)
    role = serializers.ChoiceField(choices=TeamRole.choices)


class QuotaSerializer(serializers.Serializer[Any]):
    gpus = serializers.IntegerField(allow_null=True, required=False, help_text="Whole GPUs.")
    mig_compute_slices = serializers.IntegerField(
        allow_null=True, required=False, help_text="Compute slices of the team's MIG replicas."
    )
    mps_memory_mib = serializers.IntegerField(
        allow_null=True, required=False, help_text="GPU memory of the team's MPS replicas."
    )
    mig_profiles = BoundedDictField(
        max_entries=MAX_PROFILES,
        child=serializers.IntegerField(),
        required=False,
        help_text='Replicas per MIG profile, e.g. `{"1g.10gb": 8}`; profiles not listed: free.',
    )


class UsageSerializer(serializers.Serializer[Any]):
    gpus = serializers.IntegerField()
    mig_compute_slices = serializers.IntegerField()
    mps_memory_mib = serializers.IntegerField()
    mig_profiles = serializers.DictField(child=serializers.IntegerField())


class TeamSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(max_length=100)
    slug = serializers.CharField(max_length=100, required=False)
    members = MemberSerializer(many=True, read_only=True)
    quota = QuotaSerializer(read_only=True, help_text="`null`: no limit.")
    usage = UsageSerializer(read_only=True, help_text="What the team's replicas hold now.")
    deployments = serializers.IntegerField(read_only=True)


class MembersSerializer(serializers.Serializer[Any]):
    members = BoundedListField(child=MemberSerializer(), max_length=MAX_MEMBERS)


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
    }


def _body(request: Request) -> Mapping[str, Any]:
    if not isinstance(request.data, Mapping):
        raise ServiceError("malformed_request", "The body must be a JSON object.")
    return request.data


@extend_schema_view(
    list=extend_schema(responses={200: TeamSerializer(many=True), **ERRORS}),
    retrieve=extend_schema(responses={200: TeamSerializer, **ERRORS}),
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

    @extend_schema(request=TeamSerializer, responses={201: TeamSerializer, **ERRORS})
    def create(self, request: Request) -> Response:
        body = _body(request)
        team = team_create(name=body.get("name"), slug=body.get("slug"), requested_by=request.user)
        return Response(team_body(team), status=status.HTTP_201_CREATED)

    @extend_schema(request=TeamSerializer, responses={200: TeamSerializer, **ERRORS})
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        team = team_update(team_id=parse_id(pk), changes=_body(request), requested_by=request.user)
        return Response(team_body(team))

    @extend_schema(
        responses={204: None, **ERRORS},
        description="Delete an empty team (409 `team.not_empty`; `default` stays: 409).",
    )
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        team_delete(team_id=parse_id(pk), requested_by=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=MembersSerializer,
        responses={200: TeamSerializer, **ERRORS},
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
        responses={200: TeamSerializer, **ERRORS},
        description='Any of `{"gpus": 4, "mig_compute_slices": 14, "mps_memory_mib": 65536, '
        '"mig_profiles": {"1g.10gb": 8}}`; a limit not given stays, `null` lifts it. '
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
