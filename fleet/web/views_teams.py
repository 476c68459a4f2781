"""The team pages: every team with its quota and usage, and one team's members and limits, each
limit next to what the team holds now. Admins create teams and set members and quotas here
(plain forms, posted to the same services as ``/api/v1/teams/``); everyone else reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from fleet.allocations.quotas import team_usage
from fleet.allocations.reclaims import team_reclaims
from fleet.core.errors import ServiceError
from fleet.core.models import Team, TeamRole
from fleet.core.roles import Role, role_of
from fleet.core.teams import members_of, team_create, team_members_set, team_quota_set
from fleet.placement.quota import Usage
from fleet.web.access import no_access, role_required
from fleet.web.views import page_context

LIMIT_LABELS = {
    "gpus": "Whole GPUs",
    "mig_compute_slices": "MIG compute slices",
    "mps_memory_mib": "MPS memory (MiB)",
}


@dataclass(frozen=True)
class LimitRow:
    """One limit next to what the team holds of it."""

    key: str
    label: str
    quota: int | None
    in_use: int

    @property
    def percent(self) -> float:
        if not self.quota:
            return 100.0 if self.quota == 0 and self.in_use else 0.0
        return min(100.0, round(100 * self.in_use / self.quota, 1))

    @property
    def over(self) -> bool:
        return self.quota is not None and self.in_use > self.quota


def limit_rows(team: Team, usage: Usage) -> list[LimitRow]:
    rows = [
        LimitRow("gpus", LIMIT_LABELS["gpus"], team.quota_gpus, usage.gpus),
        LimitRow(
            "mig_compute_slices",
            LIMIT_LABELS["mig_compute_slices"],
            team.quota_mig_compute_slices,
            usage.mig_compute_slices,
        ),
        LimitRow(
            "mps_memory_mib",
            LIMIT_LABELS["mps_memory_mib"],
            team.quota_mps_memory_mib,
            usage.mps_memory_mib,
        ),
    ]
    profiles = sorted(set(team.quota_mig_profiles or {}) | set(usage.mig_profiles))
    rows.extend(
        LimitRow(
            f"mig_profiles.{p}",
            f"MIG {p} replicas",
            (team.quota_mig_profiles or {}).get(p),
            usage.mig_profiles.get(p, 0),
        )
        for p in profiles
    )
    return rows


@role_required(Role.MEMBER)
@require_http_methods(["GET", "POST"])
def team_list(request: HttpRequest) -> HttpResponse:
    """Every team: members, deployments, and each limit with its usage. Admins create teams."""
    error: ServiceError | None = None
    if request.method == "POST":
        if role_of(request.user) < Role.ADMIN:
            return no_access(request, Role.ADMIN)
        try:
            team = team_create(name=request.POST.get("name", ""), requested_by=request.user)
            return redirect("web:team", team_id=team.pk)
        except ServiceError as refused:
            error = refused
    teams = [
        {"team": t, "limits": limit_rows(t, team_usage(t.pk)), "deployments": t.deployments.count()}
        for t in Team.objects.order_by("name")
    ]
    context = {
        **page_context(request, "teams"),
        "teams": teams,
        "error": error,
        "is_admin": role_of(request.user) >= Role.ADMIN,
    }
    return render(request, "web/teams.html", context, status=400 if error else 200)


def _quota_input(post: Any) -> dict[str, Any]:
    """The quota form's fields: an empty box lifts that limit; profiles as ``1g.10gb=8`` lines."""
    quota: dict[str, Any] = {}
    for key in LIMIT_LABELS:
        raw = post.get(key, "").strip()
        quota[key] = int(raw) if raw.isdecimal() else (raw or None)
    profiles: dict[str, Any] = {}
    for line in post.get("mig_profiles", "").replace(",", "\n").splitlines():
        name, _, count = line.partition("=")
        if name.strip():
            value = count.strip()
            profiles[name.strip()] = int(value) if value.isdecimal() else value
    quota["mig_profiles"] = profiles
    return quota


def _members_input(text: str) -> list[dict[str, Any]]:
    """``alice operator`` lines (role defaults to viewer) into the API's member list."""
    users = get_user_model().objects
    members: list[dict[str, Any]] = []
    for line in text.splitlines()[:1000]:
        parts = line.split()
        if not parts:
            continue
        found = users.filter(username=parts[0]).values_list("pk", flat=True).first()
        if found is None:
            raise ServiceError(
                "user.not_found", f"No user is named {parts[0]!r}.", {"username": parts[0]}
            )
        members.append({"user": found, "role": parts[1] if len(parts) > 1 else TeamRole.VIEWER})
    return members


def _post(request: HttpRequest, team: Team) -> None:
    if request.POST.get("form") == "quota":
        team_quota_set(team_id=team.pk, quota=_quota_input(request.POST), requested_by=request.user)
    elif request.POST.get("form") == "members":
        members = _members_input(request.POST.get("members", ""))
        team_members_set(team_id=team.pk, members=members, requested_by=request.user)
    else:
        raise ServiceError("malformed_request", "Unknown form.")


@role_required(Role.MEMBER)
@require_http_methods(["GET", "POST"])
def team_detail(request: HttpRequest, team_id: int) -> HttpResponse:
    """One team: members with their roles, each limit beside its usage, its deployments."""
    team = Team.objects.filter(pk=team_id).first()
    if team is None:
        raise Http404("No such team.")
    is_admin = role_of(request.user) >= Role.ADMIN
    error: ServiceError | None = None
    if request.method == "POST":
        if not is_admin:
            return no_access(request, Role.ADMIN)
        try:
            _post(request, team)
            return redirect("web:team", team_id=team.pk)
        except ServiceError as refused:
            error = refused
        team.refresh_from_db()
    members = list(members_of(team))
    context = {
        **page_context(request, "teams"),
        "team": team,
        "members": members,
        "members_text": "\n".join(f"{m.user.get_username()} {m.role}" for m in members),
        "limits": limit_rows(team, team_usage(team.pk)),
        "profiles_text": "\n".join(f"{p}={n}" for p, n in (team.quota_mig_profiles or {}).items()),
        "deployments": team.deployments.order_by("name"),
        "reclaims": team_reclaims(team.pk),
        "error": error,
        "is_admin": is_admin,
    }
    return render(request, "web/team_detail.html", context, status=400 if error else 200)
