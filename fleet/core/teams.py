"""Teams: who belongs to which team with which role, and the writes on teams and quotas.

Fleet roles (viewer, operator, admin: :mod:`fleet.core.roles`) stay as they are: a fleet
operator acts on every team's deployments, an admin manages teams. A team role adds, for a user
without the fleet operator role, the right to act on that team's deployments (``operator``).
Any team member sees the whole fleet read-only (:func:`fleet.core.roles.role_of` gives them the
member role), other teams' deployments included as names, requests and slices; what another
team's deployments run (their workload specs), their logs and their replica metrics only its
own members and fleet viewers and up read (:func:`can_see_spec`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.utils.text import slugify

from fleet.core.errors import Conflict, NotFound, ServiceError
from fleet.core.filters import ID_MAX
from fleet.core.jobs import place_queue_after_commit, reclaim_after_commit
from fleet.core.models import (
    DEFAULT_TEAM_SLUG,
    OperationKind,
    OperationStatus,
    Team,
    TeamMembership,
    TeamRole,
)
from fleet.core.operations import operation_record
from fleet.core.priorities import priority_checked
from fleet.core.roles import Role, role_of

QUOTA_KEYS = ("gpus", "mig_compute_slices", "mps_memory_mib", "mig_profiles")
MAX_QUOTA = 10**9
MAX_PROFILES = 64
MAX_MEMBERS = 1000


def team_roles_of(user: Any) -> dict[int, str]:
    """``{team id: role}`` of the user's teams (cached on the user object, like its role)."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return {}
    cached: dict[int, str] | None = getattr(user, "_fleet_teams", None)
    if cached is None:
        cached = dict(TeamMembership.objects.filter(user=user).values_list("team_id", "role"))
        user._fleet_teams = cached
    return cached


def can_operate_team(user: Any, team_id: int) -> bool:
    """Fleet operators and admins act on every team's deployments; others need the team's
    ``operator`` role."""
    if role_of(user) >= Role.OPERATOR:
        return True
    return team_roles_of(user).get(team_id) == TeamRole.OPERATOR


def can_see_spec(user: Any, team_id: int | None) -> bool:
    """Whether the user reads what the team's deployments run (image, command, env, ...), their
    replicas' logs and metrics: fleet viewers and up for every team, a team member for its own
    teams. ``team_id`` None (a deployment since deleted): fleet viewers and up only.

    The one rule the API, the pages and the exports ask; both lookups are cached on the user,
    so asking once per row of a list costs no query."""
    if role_of(user) >= Role.VIEWER:
        return True
    return team_id is not None and team_id in team_roles_of(user)


def operated_teams(user: Any) -> list[int]:
    """The teams whose deployments the user may act on as a team operator (fleet operators:
    every team, which this does not list)."""
    return sorted(t for t, role in team_roles_of(user).items() if role == TeamRole.OPERATOR)


def default_team_for(user: Any) -> int:
    """The team a new deployment joins when none is named: the user's only operated team, or
    ``default`` for a fleet operator. Refused (400 ``team.required``) when ambiguous."""
    if role_of(user) >= Role.OPERATOR:
        team, _ = Team.objects.get_or_create(
            slug=DEFAULT_TEAM_SLUG, defaults={"name": DEFAULT_TEAM_SLUG}
        )
        return team.pk
    teams = operated_teams(user)
    if len(teams) == 1:
        return teams[0]
    raise ServiceError(
        "team.required",
        "Name the deployment's 'team': you operate more than one team, or none.",
        {"teams": teams},
    )


def _checked_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > 100:
        raise ServiceError(
            "team.name_invalid", "A team name is 1 to 100 characters.", {"field": "name"}
        )
    return name.strip()


def _checked_slug(slug: Any, name: str) -> str:
    value = slugify(slug if isinstance(slug, str) and slug else name)[:100]
    if not value:
        raise ServiceError(
            "team.slug_invalid", "The slug must hold letters or digits.", {"field": "slug"}
        )
    return value


def _audit(team: Team, summary: str, requested_by: Any, **payload: Any) -> None:
    operation_record(
        kind=OperationKind.TEAM,
        summary=summary,
        requested_by=requested_by,
        status=OperationStatus.SUCCEEDED,
        payload={"team": team.pk, **payload},
    )


@transaction.atomic
def team_create(*, name: Any, slug: Any = None, requested_by: Any = None) -> Team:
    checked = _checked_name(name)
    try:
        with transaction.atomic():
            team = Team.objects.create(name=checked, slug=_checked_slug(slug, checked))
    except IntegrityError:
        raise Conflict(
            "team.name_taken", f"A team named {checked!r} (or with its slug) already exists."
        ) from None
    _audit(team, f"Created team {team.name}", requested_by)
    return team


def team_get(team_id: int) -> Team:
    """The team, or 404 ``team.not_found`` (reads; writes lock it: :func:`lock_team`)."""
    team = Team.objects.filter(pk=team_id).first()
    if team is None:
        raise NotFound("team.not_found", f"Team {team_id} does not exist.", {"team": team_id})
    return team


def lock_team(team_id: int) -> Team:
    team = Team.objects.select_for_update().filter(pk=team_id).first()
    if team is None:
        raise NotFound("team.not_found", f"Team {team_id} does not exist.", {"team": team_id})
    return team


@transaction.atomic
def team_update(*, team_id: int, changes: Mapping[str, Any], requested_by: Any = None) -> Team:
    """Rename a team (``name``, ``slug``; the ``default`` team keeps its slug) or set the
    priority class of its deployments that name none (``default_priority``; ``""``: none)."""
    team = lock_team(team_id)
    unknown = sorted(set(changes) - {"name", "slug", "default_priority"})
    if unknown:
        raise ServiceError(
            "team.field_unknown",
            f"Only 'name', 'slug' and 'default_priority' change here, not {unknown[0]!r}.",
        )
    if "default_priority" in changes:
        team.default_priority = priority_checked(changes["default_priority"], "default_priority")
    if "name" in changes:
        team.name = _checked_name(changes["name"])
    if "slug" in changes:
        if team.slug == DEFAULT_TEAM_SLUG:
            raise Conflict("team.default", "The default team keeps its slug.")
        team.slug = _checked_slug(changes["slug"], team.name)
    try:
        with transaction.atomic():
            team.save()
    except IntegrityError:
        raise Conflict("team.name_taken", "Another team has that name or slug.") from None
    _audit(team, f"Renamed team {team.name}", requested_by, changes=dict(changes))
    return team


@transaction.atomic
def team_delete(*, team_id: int, requested_by: Any = None) -> None:
    """Delete an empty team; one that owns deployments (or ``default``) stays: 409."""
    team = lock_team(team_id)
    if team.slug == DEFAULT_TEAM_SLUG:
        raise Conflict("team.default", "The default team cannot be deleted.")
    try:
        with transaction.atomic():
            team.delete()
    except ProtectedError:
        raise Conflict(
            "team.not_empty",
            f"Team {team.name} owns deployments: delete or reassign them first.",
            {"team": team_id},
        ) from None
    _audit(team, f"Deleted team {team.name}", requested_by)


def _checked_members(members: Any) -> dict[int, str]:
    if not isinstance(members, list) or len(members) > MAX_MEMBERS:
        raise ServiceError(
            "team.members_invalid",
            f"'members' is a list of {{user, role}} ({MAX_MEMBERS} at most).",
        )
    wanted: dict[int, str] = {}
    for entry in members:
        user = entry.get("user") if isinstance(entry, Mapping) else None
        role = entry.get("role", TeamRole.VIEWER) if isinstance(entry, Mapping) else None
        if (
            not isinstance(user, int)
            or isinstance(user, bool)
            or not 1 <= user <= ID_MAX
            or role not in TeamRole.values
        ):
            raise ServiceError(
                "team.members_invalid",
                "Each member is {'user': <id>, 'role': 'viewer' | 'operator'}.",
                {"entry": entry if isinstance(entry, Mapping) else None},
            )
        wanted[user] = str(role)
    return wanted


@transaction.atomic
def team_members_set(*, team_id: int, members: Any, requested_by: Any = None) -> Team:
    """Make ``members`` (``[{"user": id, "role": "viewer" | "operator"}]``) the team's members,
    exactly: users not listed leave it."""
    team = lock_team(team_id)
    wanted = _checked_members(members)
    found = set(get_user_model().objects.filter(pk__in=wanted).values_list("pk", flat=True))
    missing = sorted(set(wanted) - found)
    if missing:
        raise NotFound(
            "user.not_found", f"User {missing[0]} does not exist.", {"users": missing[:20]}
        )
    TeamMembership.objects.filter(team=team).exclude(user_id__in=wanted).delete()
    for user_id, role in wanted.items():
        TeamMembership.objects.update_or_create(team=team, user_id=user_id, defaults={"role": role})
    _audit(team, f"Set the members of team {team.name}", requested_by, members=_listed(wanted))
    return team


def _listed(members: Mapping[int, str]) -> list[dict[str, Any]]:
    return [{"user": user, "role": role} for user, role in sorted(members.items())]


def _checked_limit(key: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUOTA:
        raise ServiceError(
            "quota.invalid",
            f"'{key}' is a whole number from 0 to {MAX_QUOTA}, or null (no limit).",
            {"field": key},
        )
    return int(value)


def _checked_profiles(value: Any) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > MAX_PROFILES:
        raise ServiceError(
            "quota.invalid",
            f"'mig_profiles' maps profile names to counts ({MAX_PROFILES} profiles at most).",
            {"field": "mig_profiles"},
        )
    checked: dict[str, int] = {}
    for profile, count in value.items():
        name = str(profile).strip()
        if not name or len(name) > 32:
            raise ServiceError(
                "quota.invalid", "A profile name is 1 to 32 characters.", {"field": "mig_profiles"}
            )
        limit = _checked_limit(f"mig_profiles.{name}", count)
        if limit is not None:
            checked[name.removeprefix("mig-")] = limit
    return checked


SHARING_KEYS = ("limit", "over_quota_weight")
MAX_WEIGHT = 1000


def _checked_kinds(quota: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(quota) - set(QUOTA_KEYS))
    if unknown:
        raise ServiceError(
            "quota.field_unknown",
            f"Unknown {where} {unknown[0]!r}; the kinds are {', '.join(QUOTA_KEYS)}.",
            {"field": unknown[0], "fields": list(QUOTA_KEYS)},
        )


def _set_kinds(team: Team, prefix: str, quota: Mapping[str, Any]) -> None:
    for key in ("gpus", "mig_compute_slices", "mps_memory_mib"):
        if key in quota:
            setattr(team, f"{prefix}_{key}", _checked_limit(key, quota[key]))
    if "mig_profiles" in quota:
        setattr(team, f"{prefix}_mig_profiles", _checked_profiles(quota["mig_profiles"]))


def _set_sharing(team: Team, quota: Mapping[str, Any]) -> None:
    """``limit`` (an object of the four kinds, those given replace; ``null`` lifts them all)
    and ``over_quota_weight`` (1 to 1000)."""
    if "limit" in quota:
        limit = quota["limit"]
        if limit is None:
            limit = dict.fromkeys(QUOTA_KEYS)
        if not isinstance(limit, Mapping):
            raise ServiceError(
                "quota.invalid", "'limit' is an object of limits, or null.", {"field": "limit"}
            )
        _checked_kinds(limit, "limit")
        _set_kinds(team, "limit", limit)
    if "over_quota_weight" in quota:
        weight = quota["over_quota_weight"]
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
            raise ServiceError(
                "quota.invalid",
                f"'over_quota_weight' is a whole number from 1 to {MAX_WEIGHT}.",
                {"field": "over_quota_weight"},
            )
        team.over_quota_weight = weight


def _limits_cover_deserved(team: Team) -> None:
    """Refuse (400 ``quota.invalid``) a limit below the deserved share of its kind."""
    pairs = [
        (key, getattr(team, f"quota_{key}"), getattr(team, f"limit_{key}"))
        for key in ("gpus", "mig_compute_slices", "mps_memory_mib")
    ]
    limits = team.limit_mig_profiles or {}
    pairs += [
        (f"mig_profiles.{p}", n, limits.get(p)) for p, n in (team.quota_mig_profiles or {}).items()
    ]
    for key, deserved, limit in pairs:
        if deserved is not None and limit is not None and limit < deserved:
            raise ServiceError(
                "quota.invalid",
                f"The limit of {key} ({limit}) is below its deserved share ({deserved}).",
                {"field": f"limit.{key}"},
            )


@transaction.atomic
def team_quota_set(*, team_id: int, quota: Any, requested_by: Any = None) -> Team:
    """Set the deserved shares given (any of ``gpus``, ``mig_compute_slices``,
    ``mps_memory_mib``, ``mig_profiles``; ``null`` lifts one), the ``limit`` of each kind and
    the ``over_quota_weight``; what is not given stays. A quota below what the team holds now
    is taken: nothing is evicted, and new replicas are refused until it fits. Once it commits,
    the queue and the reclaim sweep run (:mod:`fleet.core.jobs`)."""
    if not isinstance(quota, Mapping):
        raise ServiceError("malformed_request", "The body must be a JSON object.")
    unknown = sorted(set(quota) - set(QUOTA_KEYS) - set(SHARING_KEYS))
    if unknown:
        _checked_kinds({unknown[0]: None}, "quota")
    team = lock_team(team_id)
    _set_kinds(team, "quota", quota)
    _set_sharing(team, quota)
    _limits_cover_deserved(team)
    team.save()
    operation_record(
        kind=OperationKind.SET_QUOTA,
        summary=f"Set the quota of team {team.name}",
        requested_by=requested_by,
        status=OperationStatus.SUCCEEDED,
        payload={"team": team.pk, "quota": quota_as_dict(team)},
    )
    # What waits may now be let in (the queue places it) or entitled (a reclaim takes its
    # share back): both run at once, not at beat's next period.
    place_queue_after_commit()
    reclaim_after_commit()
    return team


def _kinds_as_dict(team: Team, prefix: str) -> dict[str, Any]:
    return {
        "gpus": getattr(team, f"{prefix}_gpus"),
        "mig_compute_slices": getattr(team, f"{prefix}_mig_compute_slices"),
        "mps_memory_mib": getattr(team, f"{prefix}_mps_memory_mib"),
        "mig_profiles": dict(getattr(team, f"{prefix}_mig_profiles") or {}),
    }


def quota_as_dict(team: Team) -> dict[str, Any]:
    """The deserved share (the four kinds, as before), its ``limit`` and its weight."""
    return {
        **_kinds_as_dict(team, "quota"),
        "limit": _kinds_as_dict(team, "limit"),
        "over_quota_weight": team.over_quota_weight,
    }


def members_of(team: Team) -> Iterable[TeamMembership]:
    return team.memberships.select_related("user").order_by("user__username")
