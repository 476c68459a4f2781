"""The group map (``FLEET_SSO_GROUP_MAP``): which identity-provider groups grant which fleet
role and which team roles. Pure: stdlib only, checked once at start-up.

The map is a JSON object from group name to a grant, or to a list of grants::

    {"gpu-admins": "admin",
     "team-search": {"team": "search", "role": "operator"},
     "ml-leads": ["viewer", {"team": "ml", "role": "operator"}]}

A grant is a fleet role (``viewer``, ``operator``, ``admin``) or a team role
(``{"team": <slug>, "role": "viewer" | "operator"}``). Group names match case-insensitively
(LDAP compares them so). When several groups grant roles, the highest wins.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

FLEET_ROLES = ("viewer", "operator", "admin")  # lowest first
TEAM_ROLES = ("viewer", "operator")
MAX_GROUPS = 1000
SLUG = re.compile(r"^[-a-z0-9_]{1,100}$")


class GroupMapError(ValueError):
    """The map is not valid; the message names the group and what is wrong."""


@dataclass(frozen=True)
class TeamGrant:
    team: str
    role: str


@dataclass(frozen=True)
class GroupMap:
    """Per group (case-folded): the fleet role it grants, if any, and its team grants."""

    roles: Mapping[str, str] = field(default_factory=dict)
    teams: Mapping[str, tuple[TeamGrant, ...]] = field(default_factory=dict)

    @property
    def managed_teams(self) -> frozenset[str]:
        """Every team the map names: their memberships follow the groups; others are left
        to the admins."""
        return frozenset(grant.team for grants in self.teams.values() for grant in grants)


@dataclass(frozen=True)
class Grants:
    """What one user's groups grant: a fleet role (None: none) and ``{team slug: role}``."""

    role: str | None
    teams: Mapping[str, str]


def group_map_parse(raw: str) -> GroupMap:
    """Parse and check ``FLEET_SSO_GROUP_MAP``; an empty string is an empty map.

    Raises:
        GroupMapError: not JSON, not an object, or a grant that is not one of the forms above.
    """
    if not raw.strip():
        return GroupMap()
    try:
        data = json.loads(raw)
    except ValueError as error:
        raise GroupMapError(f"FLEET_SSO_GROUP_MAP is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise GroupMapError("FLEET_SSO_GROUP_MAP must be a JSON object {group: grant}")
    if len(data) > MAX_GROUPS:
        raise GroupMapError(f"FLEET_SSO_GROUP_MAP names more than {MAX_GROUPS} groups")
    roles: dict[str, str] = {}
    teams: dict[str, tuple[TeamGrant, ...]] = {}
    for group, value in data.items():
        key = _group_key(group)
        if key in roles or key in teams:
            raise GroupMapError(f"FLEET_SSO_GROUP_MAP names group {group!r} twice (any case)")
        role, team_grants = _grants_of(group, value)
        if role is not None:
            roles[key] = role
        if team_grants:
            teams[key] = team_grants
    return GroupMap(roles=roles, teams=teams)


def _group_key(group: str) -> str:
    name = group.strip().casefold()
    if not name or len(name) > 256:
        raise GroupMapError(f"FLEET_SSO_GROUP_MAP: group name {group!r} is empty or too long")
    return name


def _grants_of(group: str, value: Any) -> tuple[str | None, tuple[TeamGrant, ...]]:
    items = value if isinstance(value, list) else [value]
    role: str | None = None
    team_grants: list[TeamGrant] = []
    for item in items:
        if isinstance(item, str):
            if item not in FLEET_ROLES:
                raise GroupMapError(
                    f"FLEET_SSO_GROUP_MAP[{group!r}]: {item!r} is not a fleet role "
                    f"({', '.join(FLEET_ROLES)})"
                )
            role = _higher(role, item, FLEET_ROLES)
        else:
            team_grants.append(_team_grant(group, item))
    return role, tuple(team_grants)


def _team_grant(group: str, item: Any) -> TeamGrant:
    where = f"FLEET_SSO_GROUP_MAP[{group!r}]"
    if not isinstance(item, dict) or set(item) - {"team", "role"} or "team" not in item:
        raise GroupMapError(
            f'{where}: a grant is a fleet role or {{"team": <slug>, "role": "viewer"|"operator"}}'
        )
    team, role = item["team"], item.get("role", "viewer")
    if not isinstance(team, str) or not SLUG.match(team):
        raise GroupMapError(f"{where}: team {team!r} is not a team slug (a-z, 0-9, - and _)")
    if role not in TEAM_ROLES:
        raise GroupMapError(f"{where}: team role {role!r} is not one of {', '.join(TEAM_ROLES)}")
    return TeamGrant(team=team, role=role)


def _higher(current: str | None, candidate: str, order: tuple[str, ...]) -> str:
    if current is None or order.index(candidate) > order.index(current):
        return candidate
    return current


def grants_for(groups: Iterable[str], group_map: GroupMap) -> Grants:
    """What ``groups`` grant under ``group_map``: the highest fleet role and, per team, the
    highest team role. Groups the map does not name grant nothing."""
    role: str | None = None
    teams: dict[str, str] = {}
    for group in groups:
        key = group.strip().casefold()
        if key in group_map.roles:
            role = _higher(role, group_map.roles[key], FLEET_ROLES)
        for grant in group_map.teams.get(key, ()):
            teams[grant.team] = _higher(teams.get(grant.team), grant.role, TEAM_ROLES)
    return Grants(role=role, teams=teams)
