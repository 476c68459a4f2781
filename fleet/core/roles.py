"""Roles: member (sees the fleet, not other teams' specs), viewer (sees everything), operator
(acts on GPUs and deployments), admin (hosts, users, tokens).

Roles are Django groups so that the admin can assign them; a superuser is always an admin. A
member of a team (:mod:`fleet.core.teams`) without a fleet role holds :attr:`Role.MEMBER`: it
reads what every role reads (hosts, GPUs, every team's deployments as names, requests and
slices) except another team's workload specs, logs and replica metrics
(:func:`fleet.core.teams.can_see_spec`). Pages and endpoints any reader opens require
``Role.MEMBER``; ``Role.VIEWER`` and up is the fleet viewer, who reads every team's specs.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from fleet.core.models import TeamMembership


class Role(IntEnum):
    NONE = 0
    MEMBER = 1  # a team member without a fleet role: no group of its own
    VIEWER = 2
    OPERATOR = 3
    ADMIN = 4

    @property
    def label(self) -> str:
        return self.name.lower()


GROUP_NAMES = {Role.VIEWER: "viewer", Role.OPERATOR: "operator", Role.ADMIN: "admin"}


def role_of(user: Any) -> Role:
    """The highest role a user holds; anonymous and inactive users hold none."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return Role.NONE
    if user.is_superuser:
        return Role.ADMIN
    cached: Role | None = getattr(user, "_fleet_role", None)
    if cached is not None:
        return cached
    names = set(user.groups.values_list("name", flat=True))
    role = Role.NONE
    for candidate, group_name in GROUP_NAMES.items():
        if group_name in names and candidate > role:
            role = candidate
    if role is Role.NONE and _in_a_team(user):
        role = Role.MEMBER
    user._fleet_role = role
    return role


def _in_a_team(user: Any) -> bool:
    return TeamMembership.objects.filter(user=user).exists()
