"""Team quotas on the place path: a team's usage, the preview's verdict, and the check that runs
in the transaction that writes a replica's allocation.

A team with a quota serialises its placements on its row (``select_for_update``), taken after
the deployment's row and before any host or GPU row (the lock order of every place), so two
concurrent placements of one team cannot both pass a limit. A team without a quota takes no
lock: its placements race only on their hosts, as before.

What counts: the replicas in place (pending or active), not those releasing their slice. A
move's new copy does not count while the copy it replaces is in place: the replica is counted
once, so a move (and a rolling update's copies) never needs room in the quota.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum

from fleet.allocations.models import Allocation, AllocationState, Deployment, RequestKind
from fleet.allocations.selectors import placement_request
from fleet.core.alerts import QUOTA_EXCEEDED, QUOTA_WARNING, alert_emit
from fleet.core.errors import RuleViolation
from fleet.core.models import OperationKind, OperationStatus, Team
from fleet.core.operations import operation_record
from fleet.domain import Violation
from fleet.placement.quota import (
    Quota,
    Usage,
    plus,
    profile_key,
    quota_shares,
    quota_violations,
    replica_demand,
)

logger = logging.getLogger(__name__)

_PLACED = (AllocationState.PENDING, AllocationState.ACTIVE)


class QuotaExceeded(RuleViolation):
    """422 ``quota.exceeded``: ``details`` names the first limit broken (``limit``, ``quota``,
    ``in_use``, ``requested``) and ``violations`` lists every one."""

    def __init__(self, team: Team, what: str, violations: list[Violation], **extra: Any) -> None:
        first = violations[0]
        super().__init__(
            f"{what} would pass team {team.name}'s quota: {first.message}",
            violations,
            team=team.pk,
            **first.details,
            **extra,
        )


def quota_of(team: Team) -> Quota:
    return Quota(
        gpus=team.quota_gpus,
        mig_compute_slices=team.quota_mig_compute_slices,
        mps_memory_mib=team.quota_mps_memory_mib,
        mig_profiles=dict(team.quota_mig_profiles or {}),
    )


def team_usage(team_id: int) -> Usage:
    """What the team's replicas hold now (one query for the sums, one for the profiles)."""
    return usage_of(Allocation.objects.placed().filter(deployment__team_id=team_id))


def usage_of(placed: QuerySet[Allocation]) -> Usage:
    """What the replicas of these placed allocation rows hold, each counted once (a move's new
    copy not while the copy it replaces is in place)."""
    rows = placed.exclude(replaces__state__in=_PLACED)
    sums = rows.aggregate(
        gpus=Count("pk", filter=Q(kind=RequestKind.GPU)),
        slices=Sum("partition__compute_slices", filter=Q(kind=RequestKind.MIG)),
        mps=Sum("memory_mib", filter=Q(kind=RequestKind.MPS)),
    )
    profiles: dict[str, int] = {}
    per_profile = (
        rows.filter(kind=RequestKind.MIG)
        .values_list("deployment__profile")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for profile, n in per_profile:
        key = profile_key(profile)
        profiles[key] = profiles.get(key, 0) + n
    return Usage(
        gpus=sums["gpus"] or 0,
        mig_compute_slices=sums["slices"] or 0,
        mps_memory_mib=sums["mps"] or 0,
        mig_profiles=profiles,
    )


def quota_refusal(deployment: Deployment) -> list[Violation]:
    """The limits the deployment's next replica would pass now (no lock: the drag preview and
    auto-placement's early answer; the place service decides under the team's lock)."""
    team = Team.objects.get(pk=deployment.team_id)
    quota = quota_of(team)
    if not quota.bounded:
        return []
    return quota_violations(
        quota, team_usage(team.pk), replica_demand(placement_request(deployment))
    )


def quota_refusals(deployments: Iterable[Deployment]) -> dict[int, list[Violation]]:
    """:func:`quota_refusal` of many deployments (the tray), each bounded team read once."""
    teams: dict[int, Team] = {}
    usage: dict[int, Usage] = {}
    refusals: dict[int, list[Violation]] = {}
    for deployment in deployments:
        team = teams.get(deployment.team_id) or Team.objects.get(pk=deployment.team_id)
        teams[team.pk] = team
        if not team.has_quota:
            continue
        if team.pk not in usage:
            usage[team.pk] = team_usage(team.pk)
        found = quota_violations(
            quota_of(team), usage[team.pk], replica_demand(placement_request(deployment))
        )
        if found:
            refusals[deployment.pk] = found
    return refusals


def quota_check(
    *,
    deployment: Deployment,
    replica: int,
    over_quota_reason: str | None = None,
    requested_by: Any = None,
) -> None:
    """Refuse (:class:`QuotaExceeded`) a replica that would pass its team's quota. Call inside
    the placing transaction, after :func:`lock_deployment` and before any host lock.

    ``over_quota_reason``: a fault's re-placement, which may pass the quota while the fault
    lasts; it is allowed and recorded as an ``over_quota`` operation, never silently."""
    team = Team.objects.filter(pk=deployment.team_id).first()
    if team is None or not team.has_quota:
        return
    team = Team.objects.select_for_update().get(pk=team.pk)
    quota, before = quota_of(team), team_usage(team.pk)
    demand = replica_demand(placement_request(deployment))
    violations = quota_violations(quota, before, demand)
    if not violations:
        alert_thresholds(team, quota, before, plus(before, demand))
        return
    if over_quota_reason is None:
        raise QuotaExceeded(team, f"Placing {deployment.name}[{replica}]", violations)
    logger.warning(
        "%s[%s] re-placed over team %s's quota: %s",
        deployment.name,
        replica,
        team.name,
        violations[0].message,
    )
    alert_emit(
        event=QUOTA_EXCEEDED,
        summary=f"Team {team.name} is over its quota: {violations[0].message}",
        subject={"team": {"id": team.pk, "name": team.name}, "reason": over_quota_reason},
    )
    operation_record(
        kind=OperationKind.OVER_QUOTA,
        summary=f"{deployment.name}[{replica}] re-placed over team {team.name}'s quota",
        requested_by=requested_by,
        deployment=deployment,
        status=OperationStatus.SUCCEEDED,
        reason=f"{over_quota_reason}: {violations[0].message}",
        payload={"team": team.pk, "violations": [v.as_dict() for v in violations]},
    )


def alert_thresholds(team: Team, quota: Quota, before: Usage, after: Usage) -> None:
    """Webhooks hear when a placement takes a limit of the team to 90 % (``quota.warning``) or
    to 100 % (``quota.exceeded``: full, the next replica is refused), once per crossing."""
    was, now = quota_shares(quota, before), quota_shares(quota, after)
    for limit, share in now.items():
        for threshold, event in ((1.0, QUOTA_EXCEEDED), (0.9, QUOTA_WARNING)):
            if was.get(limit, 0.0) < threshold <= share:
                alert_emit(
                    event=event,
                    summary=f"Team {team.name} is at {share:.0%} of its {limit} quota",
                    subject={
                        "team": {"id": team.pk, "name": team.name},
                        "limit": limit,
                        "share": round(share, 4),
                    },
                )
                break  # the highest threshold crossed says it
