"""The replay protocol of ``../shared/data/README.md``: one pod at a time, no departures.

Pure: the caller passes the nodes, the arrival sequence, the policy and (optionally) a clock used
only to time decisions.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fleet.placement.benchmarks.cluster import Cluster
from fleet.placement.benchmarks.policies import Policy
from fleet.placement.benchmarks.trace import TraceNode, TracePod

MAX_LOAD_PERCENT = 130


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Outcome of one replay.

    Attributes:
        alloc_ratio: A(x) in percent, for x = 0 … 130 (arrived load in % of GPU capacity); a load
            that no pod rounded to carries the previous value.
        failed_pods: pods that fit nowhere when they arrived.
        placed_pods: pods placed.
        decision_ms: per-pod decision times (empty without a clock).
    """

    alloc_ratio: tuple[float, ...]
    failed_pods: int
    placed_pods: int
    total_gpus: int
    decision_ms: tuple[float, ...]

    @property
    def unallocated_gpus_130(self) -> float:
        """(1 - A(130)) x GPUs: the protocol's score (lower is better)."""
        return (1.0 - self.alloc_ratio[MAX_LOAD_PERCENT] / 100.0) * self.total_gpus


def tie_order(node_count: int, seed: int) -> list[int]:
    """The fixed per-seed random order of the nodes that breaks score ties."""
    order = list(range(node_count))
    random.Random(f"node-order-{seed}").shuffle(order)
    return order


def _round_half_up(x: float) -> int:
    return int(x + 0.5)


def replay(
    nodes: Sequence[TraceNode],
    arrivals: Sequence[TracePod],
    policy: Policy,
    *,
    order: Sequence[int] | None = None,
    clock: Callable[[], float] | None = None,
) -> ReplayResult:
    """Place ``arrivals`` one by one with ``policy`` and measure the allocation curve.

    Args:
        order: the tie order of the nodes (default: index order).
        clock: seconds, monotonic; when given, each decision is timed.
    """
    cluster = Cluster(nodes, order)
    capacity = cluster.capacity_milli
    scale = 100.0 / capacity if capacity else 0.0
    sums = [0.0] * (MAX_LOAD_PERCENT + 1)
    counts = [0] * (MAX_LOAD_PERCENT + 1)
    arrived = failed = 0
    times: list[float] = []
    for pod in arrivals:
        policy.observe(pod)
        start = clock() if clock is not None else 0.0
        placement = policy.choose(cluster, pod)
        if clock is not None:
            times.append((clock() - start) * 1000.0)
        if placement is None:
            failed += 1
        else:
            cluster.place(pod, placement)
        arrived += pod.gpu_request_milli
        x = _round_half_up(scale * arrived)
        if x <= MAX_LOAD_PERCENT:
            sums[x] += scale * cluster.allocated_milli
            counts[x] += 1
    curve: list[float] = []
    for x in range(MAX_LOAD_PERCENT + 1):
        curve.append(sums[x] / counts[x] if counts[x] else (curve[-1] if curve else 0.0))
    return ReplayResult(
        alloc_ratio=tuple(curve),
        failed_pods=failed,
        placed_pods=len(arrivals) - failed,
        total_gpus=capacity // 1000,
        decision_ms=tuple(times),
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; 0 when empty."""
    if not values:
        return 0.0
    ranked = sorted(values)
    index = min(len(ranked) - 1, max(0, round(q / 100.0 * len(ranked) + 0.5) - 1))
    return ranked[index]
