"""The queue: every replica without a place, in the order it is served (priority, then its
team's weighted share of decayed use, then the longest waiting: :func:`queue_order`), each with
its position and what blocks it now.

What blocks a replica, first match: its team's quota or limit, or borrowing what another team's
deserved share needs (``quota.*``); it fits now (``queue.fits_now``: the engine or an operator
places it); else the engine's main reason nothing fits (``placement.*``, ``mig.*``, ...).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import Max, Q
from django.utils import timezone

from fleet.allocations.accounting.usage import rates
from fleet.allocations.models import Allocation, Deployment, UsageInterval
from fleet.allocations.quotas import quota_refusals
from fleet.allocations.rankings import FitNow, deployments_fit_now
from fleet.core.models import Team
from fleet.core.priorities import NO_PRIORITY, effective_priority, priority_values
from fleet.domain import Violation
from fleet.inventory.models import Gpu
from fleet.placement.fairshare import (
    QUEUE_FITS_NOW,
    Queued,
    UseInterval,
    Waiting,
    queue_order,
    team_shares,
)

MAX_LISTED = 1000
"""Waiting replicas the queue lists at most (the first ones served)."""
HISTORY_HALF_LIVES = 10
"""Use older than this many half-lives weighs under 0.1 %: not read."""


@dataclass(frozen=True)
class QueueEntry:
    """One waiting replica at its place, with its deployment, team, priority and blocker."""

    queued: Queued
    deployment: Deployment
    team: Team
    priority: str
    reason: Violation

    @property
    def waiting_since(self) -> datetime:
        return datetime.fromtimestamp(self.queued.waiting.waiting_since_s, tz=UTC)


def half_life_s() -> float:
    return float(settings.FLEET_FAIRSHARE_HALF_LIFE_S)


def _ended(deployment_ids: list[int]) -> dict[tuple[int, int], datetime]:
    """When each replica last gave up a place (its latest closed usage interval)."""
    rows = (
        UsageInterval.objects.filter(deployment_id__in=deployment_ids, ended_at__isnull=False)
        .values("deployment_id", "replica")
        .annotate(last=Max("ended_at"))
    )
    return {(r["deployment_id"], r["replica"]): r["last"] for r in rows}


def waiting_replicas() -> tuple[list[Waiting], dict[int, Deployment]]:
    """Every replica of a live deployment that has no place, with its priority value and since
    when it waits (its deployment's creation, or the last time the replica left a place)."""
    deployments = {
        d.pk: d for d in Deployment.objects.filter(deleting=False).select_related("team")
    }
    placed: dict[int, set[int]] = defaultdict(set)
    for deployment_id, replica in Allocation.objects.placed().values_list("deployment", "replica"):
        placed[deployment_id].add(replica)
    values = priority_values()
    ended = _ended(list(deployments))
    found = []
    for d in deployments.values():
        name = effective_priority(d.priority, d.team.default_priority)
        for replica in sorted(set(range(d.replicas)) - placed[d.pk]):
            since = max(d.created_at, ended.get((d.pk, replica), d.created_at))
            found.append(
                Waiting(d.pk, replica, d.team_id, values.get(name, NO_PRIORITY), since.timestamp())
            )
    return found, deployments


def use_intervals(now: datetime, half_life: float) -> list[UseInterval]:
    """The usage intervals Fleet keeps, within the decay's reach, as GPU-equivalent rates."""
    since = now - timedelta(seconds=half_life * HISTORY_HALF_LIVES)
    rows = UsageInterval.objects.filter(started_at__lt=now).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=since)
    )
    return [
        UseInterval(
            row.team_id or 0,
            row.started_at.timestamp(),
            row.ended_at.timestamp() if row.ended_at else None,
            rates(row)["gpu_equivalent_hours"],
        )
        for row in rows.iterator(chunk_size=2000)
    ]


def current_shares(now: datetime | None = None) -> dict[int, float]:
    """Each team's weighted share of decayed use now (:func:`team_shares`)."""
    now = now or timezone.now()
    half_life = half_life_s()
    return team_shares(
        use_intervals(now, half_life),
        now_s=now.timestamp(),
        half_life_s=half_life,
        capacity_gpu_eq=float(Gpu.objects.count()),
        weights=dict(Team.objects.values_list("pk", "over_quota_weight")),
    )


def _blockers(
    queued: list[Queued], deployments: dict[int, Deployment]
) -> dict[tuple[int, int], Violation]:
    """What blocks each queued replica: its quota, else fitting now (as many of a deployment's
    replicas as fit, in queue order), else the engine's main reason."""
    wanting: dict[int, int] = defaultdict(int)
    for q in queued:
        wanting[q.waiting.deployment_id] += 1
    refused = quota_refusals(deployments[pk] for pk in wanting)
    fits = deployments_fit_now(
        [(deployments[pk], n) for pk, n in wanting.items() if pk not in refused]
    )
    seen: dict[int, int] = defaultdict(int)
    found = {}
    for q in queued:
        pk = q.waiting.deployment_id
        turn, seen[pk] = seen[pk], seen[pk] + 1
        key = (pk, q.waiting.replica)
        found[key] = (
            refused[pk][0] if pk in refused else _fit_reason(fits.get(pk), turn, deployments[pk])
        )
    return found


def _fit_reason(fit: FitNow | None, turn: int, deployment: Deployment) -> Violation:
    if fit is not None and turn < fit.fits:
        how = "the engine places it" if deployment.auto_place else "waiting to be placed"
        return Violation(QUEUE_FITS_NOW, f"It fits now: {how}.", {})
    if fit is not None and fit.reasons:
        return fit.reasons[0][0]
    return Violation(
        "placement.no_capacity",
        "No GPU has room for it now, after the replicas of its deployment that fit.",
        {},
    )


def fleet_queue(now: datetime | None = None) -> list[QueueEntry]:
    """The waiting replicas in the order they are served (the first :data:`MAX_LISTED`)."""
    waiting, deployments = waiting_replicas()
    queued = queue_order(waiting, current_shares(now))[:MAX_LISTED]
    blockers = _blockers(queued, deployments)
    values = priority_values()
    entries = []
    for q in queued:
        d = deployments[q.waiting.deployment_id]
        name = effective_priority(d.priority, d.team.default_priority)
        reason = blockers[(d.pk, q.waiting.replica)]
        entries.append(QueueEntry(q, d, d.team, name if name in values else "", reason))
    return entries
