"""Team quotas on the place path: a team's usage, the preview's verdict, and the check that runs
in the transaction that writes a replica's allocation.

A team with a quota serialises its placements on its row (``select_for_update``), taken after
the deployment's row and before any host or GPU row (the lock order of every place), so two
concurrent placements of one team cannot both pass a limit. A team without a quota takes no
lock: its placements race only on their hosts, as before.

What counts: the replicas in place (pending or active), not those releasing their slice, and
the new copies of the team's moves in flight but one. A move's new copy runs beside the copy it
replaces until it runs; as Kubernetes' ``maxSurge`` meets a ``ResourceQuota``, each team has
ONE surge replica: its oldest move in flight is not counted, and every other move's new copy
counts against the quota until the move ends. So a team at its quota can still move one replica
at a time, one with headroom moves as many as fit in it, and no team holds more than its quota
plus one replica. A plain move (an operator's, a rolling update's) past that is refused
(:func:`move_quota_check`); the fleet's own moves (drains, maintenance, a fault's re-placement,
repack and defragmentation) pass it, each time recorded as an ``over_quota`` operation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum

from fleet.allocations.models import Allocation, AllocationState, Deployment, RequestKind
from fleet.allocations.selectors import placement_request
from fleet.core.alerts import QUOTA_EXCEEDED, QUOTA_WARNING, alert_emit
from fleet.core.errors import RuleViolation
from fleet.core.models import Operation, OperationKind, OperationStatus, Team
from fleet.core.operations import RUNNING, operation_record
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
    ``in_use``, ``requested``) and ``violations`` lists every one; ``note`` ends the message."""

    def __init__(
        self, team: Team, what: str, violations: list[Violation], note: str = "", **extra: Any
    ) -> None:
        first = violations[0]
        super().__init__(
            f"{what} would pass team {team.name}'s quota: {first.message}"
            + (f" {note}" if note else ""),
            violations,
            team=team.pk,
            **first.details,
            **extra,
        )


@dataclass(frozen=True)
class MovingCopy:
    """The new copy of one of a team's moves in flight: its replica and its allocations."""

    deployment_id: int
    name: str
    replica: int
    allocation_ids: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{self.name}[{self.replica}]"


def quota_of(team: Team) -> Quota:
    return Quota(
        gpus=team.quota_gpus,
        mig_compute_slices=team.quota_mig_compute_slices,
        mps_memory_mib=team.quota_mps_memory_mib,
        mig_profiles=dict(team.quota_mig_profiles or {}),
    )


def team_usage(team_id: int, moving: list[MovingCopy] | None = None) -> Usage:
    """What the team holds against its quota now: its replicas, each counted once, and the new
    copies of its moves in flight but the first (its one surge replica). ``moving``: the
    team's :func:`moving_copies`, when read already."""
    placed = Allocation.objects.placed().filter(deployment__team_id=team_id)
    held = usage_of(placed)
    if moving is None:
        moving = moving_copies(team_id)
    if len(moving) < 2:
        return held
    counted = [pk for copy in moving[1:] for pk in copy.allocation_ids]
    return plus(held, _summed(placed.filter(pk__in=counted)))


def moving_copies(team_id: int) -> list[MovingCopy]:
    """The new copies of the team's moves in flight (each beside the copy it replaces, still in
    place), oldest first: the first is the team's surge replica."""
    rows = (
        Allocation.objects.placed()
        .filter(deployment__team_id=team_id, replaces__state__in=_PLACED)
        .order_by("pk")
        .values_list("pk", "deployment_id", "deployment__name", "replica")
    )
    copies: dict[tuple[int, int], list[Any]] = {}
    for pk, deployment_id, name, replica in rows:
        found = copies.setdefault((deployment_id, replica), [name, []])
        found[1].append(pk)
    return [
        MovingCopy(deployment_id, name, replica, tuple(pks))
        for (deployment_id, replica), (name, pks) in copies.items()
    ]


def usage_of(placed: QuerySet[Allocation]) -> Usage:
    """What the replicas of these placed allocation rows hold, each counted once (a move's new
    copy not while the copy it replaces is in place)."""
    return _summed(placed.exclude(replaces__state__in=_PLACED))


def _summed(rows: QuerySet[Allocation]) -> Usage:
    """What these allocation rows hold (one query for the sums, one for the profiles)."""
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
    _record_over_quota(
        team,
        deployment,
        f"{deployment.name}[{replica}] re-placed",
        violations,
        over_quota_reason,
        requested_by,
    )


def move_quota_check(
    *,
    deployment: Deployment,
    replica: int,
    over_quota_reason: str | None = None,
    requested_by: Any = None,
) -> None:
    """Refuse (:class:`QuotaExceeded`) a move whose new copy the team's quota cannot count. Call
    inside the moving transaction, after :func:`lock_deployment` and before any host lock (the
    lock order of :func:`quota_check`).

    The team's first move in flight is its surge replica and is not counted: a move while no
    other move of the team is in flight always passes. Otherwise the new copy counts, as do the
    other moves' copies but the surge (:func:`team_usage`), and must fit in the quota.

    ``over_quota_reason``: a move the fleet makes (a drain, maintenance, a fault, repack,
    defragmentation), which may pass the quota; it is allowed and recorded as an
    ``over_quota`` operation, never silently."""
    team = Team.objects.filter(pk=deployment.team_id).first()
    if team is None or not team.has_quota:
        return
    team = Team.objects.select_for_update().get(pk=team.pk)
    moving = moving_copies(team.pk)
    if not moving:
        return  # this move is the team's surge replica
    demand = replica_demand(placement_request(deployment))
    violations = quota_violations(quota_of(team), team_usage(team.pk, moving), demand)
    if not violations:
        return
    name = f"{deployment.name}[{replica}]"
    if over_quota_reason is None:
        surge = moving[0]
        operations = _move_operations(moving)
        surge_operation = operations.get(surge.allocation_ids[0])
        where = f" (operation {surge_operation})" if surge_operation is not None else ""
        raise QuotaExceeded(
            team,
            f"Moving {name}",
            violations,
            note=f"The team's one surge replica is in use by the move of {surge.label}{where}: "
            "past it, a move's new copy counts against the quota until the move ends. Move "
            "it once that move has ended.",
            surge_in_use=True,
            moving=[
                {
                    "deployment": copy.deployment_id,
                    "replica": copy.replica,
                    "operation": operations.get(copy.allocation_ids[0]),
                }
                for copy in moving[:MAX_LISTED]
            ],
        )
    _record_over_quota(
        team, deployment, f"{name} moved", violations, over_quota_reason, requested_by
    )


MAX_LISTED = 20
"""Moves in flight a refusal lists at most."""


def _move_operations(moving: list[MovingCopy]) -> dict[int, int]:
    """The running ``move`` operation of each copy, by the copy's first allocation."""
    firsts = {copy.allocation_ids[0] for copy in moving}
    found: dict[int, int] = {}
    running = Operation.objects.filter(
        kind=OperationKind.MOVE,
        status__in=RUNNING,
        deployment_id__in={copy.deployment_id for copy in moving},
    ).values_list("pk", "payload")
    for pk, payload in running:
        target = payload.get("to_allocation") if isinstance(payload, dict) else None
        if target in firsts:
            found[int(target)] = pk
    return found


def _record_over_quota(
    team: Team,
    deployment: Deployment,
    what: str,
    violations: list[Violation],
    reason: str,
    requested_by: Any,
) -> None:
    logger.warning("%s over team %s's quota: %s", what, team.name, violations[0].message)
    alert_emit(
        event=QUOTA_EXCEEDED,
        summary=f"Team {team.name} is over its quota: {violations[0].message}",
        subject={"team": {"id": team.pk, "name": team.name}, "reason": reason},
    )
    operation_record(
        kind=OperationKind.OVER_QUOTA,
        summary=f"{what} over team {team.name}'s quota",
        requested_by=requested_by,
        deployment=deployment,
        status=OperationStatus.SUCCEEDED,
        reason=f"{reason}: {violations[0].message}",
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
