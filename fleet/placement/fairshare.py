"""The queue of waiting replicas: priority first, then each team's weighted share of use.

Stdlib only; ``now`` is passed in. A team's use is the GPU-equivalents its replicas held (each
replica's dominant resource: a MIG slice's share of its GPU's slices, an MPS share's larger of
memory and compute share, a whole GPU 1), integrated over time with an exponential decay of
half-life ``h``: one GPU-equivalent held for a second ``t`` seconds ago counts ``2**(-t/h)``.
Its share is that decayed use over the fleet's capacity (GPU-equivalents times the integral of
the decay, ``h / ln 2``: a team that held the whole fleet forever has share 1), divided by its
``over_quota_weight``. Within a priority, the team with the smaller share goes first; ties go to
the replica that has waited longest, then by deployment and replica (a total order).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

QUEUE_FITS_NOW = "queue.fits_now"


@dataclass(frozen=True)
class UseInterval:
    """``rate`` GPU-equivalents held from ``start_s`` to ``end_s`` (``None``: still held)."""

    team_id: int
    start_s: float
    end_s: float | None
    rate: float


@dataclass(frozen=True)
class Waiting:
    """One replica without a place: its deployment and replica, its team, its priority value
    (higher first) and since when it waits (seconds, the same clock as ``now``)."""

    deployment_id: int
    replica: int
    team_id: int
    priority: int
    waiting_since_s: float


@dataclass(frozen=True)
class Queued:
    """A waiting replica at its place in the queue (``position`` 1 is served first) with its
    team's weighted share when it was ordered."""

    waiting: Waiting
    position: int
    team_share: float


def decayed_use(interval: UseInterval, now_s: float, half_life_s: float) -> float:
    """GPU-equivalent-seconds of the interval, each weighted ``2**(-(now - t) / half_life)``.

    The integral of ``rate * 2**(-(now - t)/h)`` over ``[start, end]`` is
    ``rate * h / ln 2 * (2**(-(now - end)/h) - 2**(-(now - start)/h))``; a time after ``now``
    counts as ``now``."""
    end = now_s if interval.end_s is None else min(interval.end_s, now_s)
    start = min(interval.start_s, end)
    if interval.rate <= 0 or end <= start:
        return 0.0
    k = math.log(2) / half_life_s
    return interval.rate * (math.exp(-k * (now_s - end)) - math.exp(-k * (now_s - start))) / k


def team_shares(
    intervals: Iterable[UseInterval],
    *,
    now_s: float,
    half_life_s: float,
    capacity_gpu_eq: float,
    weights: Mapping[int, int],
) -> dict[int, float]:
    """Each team's weighted share of decayed use (teams without use: absent, i.e. 0).

    Args:
        intervals: the usage intervals Fleet keeps, as GPU-equivalent rates.
        capacity_gpu_eq: the fleet's GPU-equivalents (its GPU count); at least 1 is assumed.
        weights: each team's ``over_quota_weight`` (absent: 1)."""
    used: dict[int, float] = {}
    for interval in intervals:
        use = decayed_use(interval, now_s, half_life_s)
        if use > 0:
            used[interval.team_id] = used.get(interval.team_id, 0.0) + use
    whole = max(capacity_gpu_eq, 1.0) * half_life_s / math.log(2)
    return {team: use / whole / max(weights.get(team, 1), 1) for team, use in used.items()}


def queue_order(waiting: Iterable[Waiting], shares: Mapping[int, float]) -> list[Queued]:
    """The waiting replicas in the order they are served: higher priority first, then the team
    with the smaller weighted share, then the longest waiting, then deployment and replica."""

    def key(w: Waiting) -> tuple[int, float, float, int, int]:
        return (
            -w.priority,
            shares.get(w.team_id, 0.0),
            w.waiting_since_s,
            w.deployment_id,
            w.replica,
        )

    ordered = sorted(waiting, key=key)
    return [Queued(w, i + 1, shares.get(w.team_id, 0.0)) for i, w in enumerate(ordered)]
