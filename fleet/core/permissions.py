"""Role-based access for the API: any role reads (team members too: :attr:`Role.MEMBER`),
operators act, admins manage hosts and tokens. Another team's workload specs, logs and replica
metrics are the views' to withhold (:func:`fleet.core.teams.can_see_spec`)."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from fleet.core.roles import Role, role_of
from fleet.core.teams import operated_teams


class RolePermission(BasePermission):
    """Any role for reads (a team member's included), operator for writes; a view may raise the
    bar with ``required_roles``."""

    message = "Your role does not allow this action."

    def has_permission(self, request: Request, view: Any) -> bool:
        role = role_of(request.user)
        if role is Role.NONE:
            return False
        required = getattr(view, "required_roles", {}).get(getattr(view, "action", None))
        if required is None:
            required = Role.MEMBER if request.method in SAFE_METHODS else Role.OPERATOR
        return role >= required


class TeamRolePermission(RolePermission):
    """Deployments: any role reads; fleet operators act on every deployment, a team operator on
    its team's (the view checks the deployment's team: :func:`fleet.core.teams.can_operate_team`).
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        if super().has_permission(request, view):
            return True
        return (
            request.method not in SAFE_METHODS
            and getattr(view, "action", None) in getattr(view, "team_actions", ())
            and bool(operated_teams(request.user))
        )


class IsAdminRole(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return role_of(request.user) >= Role.ADMIN


class AnyRole(BasePermission):
    """Any role, even for POST: for dry runs that change nothing (``/mig/validate``)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        return role_of(request.user) >= Role.MEMBER
