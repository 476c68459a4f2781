"""The trace benchmark: policies by name, one replay per (policy, seed), JSON-shaped results.

Pure: the caller reads the CSV files and passes rows in, and passes a clock for decision times.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import TypedDict

from fleet.placement.benchmarks.frag import typical_mix
from fleet.placement.benchmarks.fragaware import FragmentationAware
from fleet.placement.benchmarks.policies import BestFit, Fgd, FirstFit, Policy, RandomFit
from fleet.placement.benchmarks.product import ProductPolicy
from fleet.placement.benchmarks.replay import (
    MAX_LOAD_PERCENT,
    ReplayResult,
    percentile,
    replay,
    tie_order,
)
from fleet.placement.benchmarks.trace import MILLI, TraceNode, TracePod, arrival_order

DEFAULT_POLICY = "product"
POLICIES = ("product", "fgd+", "fgd", "bestfit", "random", "firstfit")
PUBLISHED_NAMES = {"Random": "random", "BestFit": "bestfit", "FGD": "fgd"}


class DecisionMs(TypedDict):
    p50: float
    p99: float


class RunResult(TypedDict):
    policy: str
    seed: int
    uses_trace_mix: bool
    alloc_ratio: dict[str, float]
    unallocated_gpus_130: float
    failed_pods: int
    decision_ms: DecisionMs


def make_policy(
    name: str,
    pods: Sequence[TracePod],
    seed: int,
    nodes: Sequence[TraceNode] = (),
    order: Sequence[int] | None = None,
) -> Policy:
    """Build a policy by name; FGD gets the trace's own mix, ``fgd+`` and ``product`` learn it
    online. ``product`` (the product engine through ``rank``) keeps its own snapshot of
    ``nodes``, listed in the tie ``order``.

    Raises:
        ValueError: for an unknown name.
    """
    if name == "product":
        return ProductPolicy(nodes, order)
    if name == "fgd+":
        return FragmentationAware()
    if name == "fgd":
        return Fgd(typical_mix(pods))
    if name == "bestfit":
        return BestFit()
    if name == "random":
        return RandomFit(seed)
    if name == "firstfit":
        return FirstFit()
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


def run_one(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policy_name: str,
    seed: int,
    *,
    clock: Callable[[], float] | None = None,
) -> RunResult:
    """Replay ``pods`` on ``nodes`` under the protocol with one policy and one seed."""
    capacity = MILLI * sum(n.gpu_count for n in nodes)
    arrivals = arrival_order(pods, capacity, seed=seed)
    order = tie_order(len(nodes), seed)
    policy = make_policy(policy_name, pods, seed, nodes, order)
    result = replay(nodes, arrivals, policy, order=order, clock=clock)
    return as_run_result(policy_name, seed, policy.uses_trace_mix, result)


def as_run_result(name: str, seed: int, uses_trace_mix: bool, result: ReplayResult) -> RunResult:
    """The JSON shape of one replay."""
    return RunResult(
        policy=name,
        seed=seed,
        uses_trace_mix=uses_trace_mix,
        alloc_ratio={str(x): round(v, 4) for x, v in enumerate(result.alloc_ratio)},
        unallocated_gpus_130=round(result.unallocated_gpus_130, 2),
        failed_pods=result.failed_pods,
        decision_ms=DecisionMs(
            p50=round(percentile(result.decision_ms, 50), 4),
            p99=round(percentile(result.decision_ms, 99), 4),
        ),
    )


def published_means(rows: Iterable[dict[str, str]], workload: str) -> dict[str, float]:
    """Mean A(130) per published scheduler for ``workload`` (e.g. ``openb_pod_list_default``).

    Keys are our policy names where we re-implement the scheduler (``fgd``, ``bestfit``,
    ``random``), else the published name.
    """
    values: dict[str, list[float]] = {}
    for row in rows:
        if row["workload"] != workload:
            continue
        published = row["sc_policy"].split("-", 1)[-1]
        name = PUBLISHED_NAMES.get(published, published)
        values.setdefault(name, []).append(float(row[str(MAX_LOAD_PERCENT)]))
    return {name: statistics.fmean(v) for name, v in values.items()}


class Summary(TypedDict):
    policy: str
    seeds: int
    uses_trace_mix: bool
    alloc_130_mean: float
    unallocated_gpus_130_mean: float
    unallocated_gpus_130_min: float
    unallocated_gpus_130_max: float
    failed_pods_mean: float
    p50_ms: float
    p99_ms: float


def summarize(results: Sequence[RunResult]) -> list[Summary]:
    """Per policy, in first-seen order: means over seeds (decision times: the worst seed)."""
    names = list(dict.fromkeys(r["policy"] for r in results))
    out: list[Summary] = []
    for name in names:
        runs = [r for r in results if r["policy"] == name]
        out.append(
            Summary(
                policy=name,
                seeds=len(runs),
                uses_trace_mix=runs[0]["uses_trace_mix"],
                alloc_130_mean=statistics.fmean(r["alloc_ratio"]["130"] for r in runs),
                unallocated_gpus_130_mean=statistics.fmean(r["unallocated_gpus_130"] for r in runs),
                unallocated_gpus_130_min=min(r["unallocated_gpus_130"] for r in runs),
                unallocated_gpus_130_max=max(r["unallocated_gpus_130"] for r in runs),
                failed_pods_mean=statistics.fmean(r["failed_pods"] for r in runs),
                p50_ms=max(r["decision_ms"]["p50"] for r in runs),
                p99_ms=max(r["decision_ms"]["p99"] for r in runs),
            )
        )
    return out
