"""The team checks of the REST API, in one place: who may act on a deployment or a replica (its
team's operators, fleet operators), who may read what a replica runs, prints and uses (its
team's members, fleet viewers and up), which team a new deployment joins, and the fleet-role
gates of single views (the layout advisor, a team's policy and secrets).

The rules themselves are :mod:`fleet.core.teams` and :mod:`fleet.core.roles`; the viewset
permission classes (``AnyRole``, ``TeamRolePermission``, ``IsAdminRole``) are
:mod:`fleet.core.permissions`. A check that fails raises DRF's ``PermissionDenied`` (403
``auth.forbidden``); one on a missing row lets the caller answer 404."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from fleet.allocations.models import Allocation, Deployment
from fleet.core.errors import ServiceError
from fleet.core.models import Team
from fleet.core.roles import GROUP_NAMES, Role, role_of
from fleet.core.teams import can_operate_team, can_see_spec, default_team_for, team_roles_of


def authorize_deployment(user: Any, deployment_id: int) -> None:
    """403 unless the user may act on the deployment's team (a missing one: the service 404s)."""
    team_id = Deployment.objects.filter(pk=deployment_id).values_list("team_id", flat=True).first()
    if team_id is not None and not can_operate_team(user, team_id):
        raise PermissionDenied("Only the operators of this deployment's team may change it.")


def authorize_allocation(user: Any, allocation_id: int) -> None:
    """403 unless the user may act on the replica's team (a missing one: the service 404s)."""
    team_id = _replica_team(allocation_id)
    if team_id is not None and not can_operate_team(user, team_id):
        raise PermissionDenied("Only the operators of this replica's team may move it.")


def authorize_replica_read(user: Any, allocation_id: int) -> None:
    """403 unless the user may read what the replica runs, prints and uses (its logs, its
    metrics): its team's members and fleet viewers and up (a missing one: the caller 404s)."""
    team_id = _replica_team(allocation_id)
    if team_id is not None and not can_see_spec(user, team_id):
        raise PermissionDenied(
            "Only the members of this replica's team and fleet viewers read its logs and metrics."
        )


def _replica_team(allocation_id: int) -> int | None:
    return (
        Allocation.objects.filter(pk=allocation_id)
        .values_list("deployment__team_id", flat=True)
        .first()
    )


def reader_sees_spec(context: Mapping[str, Any], team_id: int | None) -> bool:
    """Whether the request in a serializer's ``context`` may read the workload specs of
    ``team_id``'s deployments (:func:`fleet.core.teams.can_see_spec`). No request: the answer
    to a write, read by its author, who operates the team."""
    request = context.get("request")
    return request is None or can_see_spec(request.user, team_id)


def spec_reader(user: Any) -> Callable[[int | None], bool]:
    """Whether ``user`` may read the workload specs of a team's deployments, as a predicate on
    the team's id (what lists of another team's replicas filter with)."""
    return lambda team_id: can_see_spec(user, team_id)


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


def has_fleet_role(user: Any) -> bool:
    """A fleet role of its own (a group, or superuser), not only the viewer role every team
    member gets."""
    return bool(user.is_superuser) or user.groups.filter(name__in=GROUP_NAMES.values()).exists()


def authorize_team_secrets(request: Request, team: Team) -> None:
    """Reads: the team's members and fleet viewers and up; writes: the team's operators and
    fleet operators and up."""
    user = request.user
    if request.method == "GET":
        if team.pk in team_roles_of(user) or has_fleet_role(user):
            return
        raise PermissionDenied("Only the team's members and fleet viewers see its secrets.")
    if not can_operate_team(user, team.pk):
        raise PermissionDenied("Only the team's operators and fleet operators set its secrets.")


def require_fleet_admin(user: Any, message: str) -> None:
    """403 with ``message`` unless the user is a fleet admin."""
    if role_of(user) < Role.ADMIN:
        raise PermissionDenied(message)


class OperatorRole(BasePermission):
    """Operators and admins: starting the layout advisor's solver costs seconds of several CPU
    threads."""

    message = "Only operators may start the layout advisor (its solver runs for seconds)."

    def has_permission(self, request: Request, view: Any) -> bool:
        return role_of(request.user) >= Role.OPERATOR
