"""The MIG variant of the trace benchmark: the Alibaba pods as MIG requests on one product.

Mapping (``../shared/data/README.md``, "Deriving MIG workloads"): a sharing pod takes the smallest
MIG profile whose compute fraction k/C (C compute slices: 7 on the 8-slice products) covers
``gpu_milli``/1000, the fewest memory slices among equals, media-extension profiles left out; a
whole-GPU or multi-GPU pod takes ``num_gpu`` full-GPU instances (7g). CPU-only pods are skipped.

Two measurements:

* packing: every job of the trace, in a seeded random order, placed online on an open-ended fleet
  (a GPU is opened when nothing fits) with the MIG fit of :func:`fleet.placement.rank`; GPUs used
  against a proven lower bound and the offline repack (:mod:`fleet.placement.benchmarks.repack`);
* churn: arrivals at ``creation_time``, departures at ``deletion_time`` (departures first on
  ties) on a fixed fleet; a job all of whose instances cannot be placed on arrival is rejected.
  The default fleet is the peak lower bound of the jobs alive at once, the smallest fleet that
  could accept every job, and a tight one at 80 % of it.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict

from fleet.mig import PRODUCTS, Instance, Product, Profile, find_product, product_by_key
from fleet.placement.benchmarks.migfleet import MigFleet, as_snapshot, strategy_scorer
from fleet.placement.benchmarks.repack import DEFAULT_TIME_LIMIT_S, repack
from fleet.placement.benchmarks.replay import percentile
from fleet.placement.benchmarks.trace import MILLI, TracePod
from fleet.placement.fit import STRATEGIES, Strategy, rank
from fleet.placement.snapshot import MigRequest

MIG_STRATEGIES = ("fragmentation_aware", "best_fit", "first_fit")
TIGHT_FLEET = 0.8
RANK_EVERY = 25


@dataclass(frozen=True, slots=True)
class MigJob:
    """One pod as MIG requests: one profile id per instance (``num_gpu`` x 7g for whole GPUs)."""

    name: str
    profile_ids: tuple[int, ...]
    creation_time: int | None = None
    deletion_time: int | None = None


def resolve_product(ref: str) -> Product:
    """A MIG product by key, short name (``H100``: the first catalog key starting ``h100-``) or
    NVML name.

    Raises:
        ValueError: when no MIG-capable product answers to ``ref``.
    """
    wanted = ref.strip().lower()
    product = product_by_key(wanted)
    if product is None:
        product = next((p for p in PRODUCTS if p.key.startswith(f"{wanted}-")), None)
    if product is None:
        product = find_product(name=ref)
    if product is None or not product.mig_capable:
        keys = ", ".join(p.key for p in PRODUCTS if p.mig_capable)
        raise ValueError(f"no MIG product {ref!r}; choose from {keys}")
    return product


def profile_for_milli(product: Product, gpu_milli: int) -> Profile:
    """The smallest profile whose compute fraction covers ``gpu_milli`` of one GPU."""
    plain = [p for p in product.profiles if p.media == ""]
    covering = [
        p for p in plain if p.compute_slices * MILLI >= gpu_milli * product.compute_slice_count
    ]
    return min(covering, key=lambda p: (p.compute_slices, p.memory_slices, p.id))


def mig_jobs(pods: Sequence[TracePod], product: Product) -> tuple[MigJob, ...]:
    """The trace's GPU pods as MIG jobs on ``product``."""
    whole = profile_for_milli(product, MILLI).id
    jobs = []
    for pod in pods:
        if pod.num_gpu <= 0:
            continue
        if pod.is_sharing:
            ids: tuple[int, ...] = (profile_for_milli(product, pod.gpu_milli).id,)
        else:
            ids = (whole,) * pod.num_gpu
        jobs.append(MigJob(pod.name, ids, pod.creation_time, pod.deletion_time))
    return tuple(jobs)


class Placed:
    """Places whole jobs on a :class:`MigFleet`: all instances or none."""

    def __init__(self, fleet: MigFleet, clock: Callable[[], float] | None = None) -> None:
        self.fleet = fleet
        self.clock = clock
        self.decision_ms: list[float] = []

    def place(self, job: MigJob) -> list[tuple[int, Instance]] | None:
        """Place every instance of ``job``, or nothing (``None``)."""
        start = self.clock() if self.clock is not None else 0.0
        done: list[tuple[int, Instance]] = []
        for profile_id in job.profile_ids:
            profile = self.fleet.product.profile(profile_id)
            choice = self.fleet.place(profile) if profile is not None else None
            if choice is None:
                self.release(done)
                done = []
                break
            done.append(choice)
        if self.clock is not None:
            self.decision_ms.append((self.clock() - start) * 1000.0)
        return done or None

    def release(self, placed: Sequence[tuple[int, Instance]]) -> None:
        """Destroy the instances of one job."""
        for gpu, instance in placed:
            self.fleet.remove(gpu, instance)


def pack_online(
    jobs: Sequence[MigJob],
    product: Product,
    strategy: str,
    seed: int,
    clock: Callable[[], float] | None = None,
) -> tuple[int, list[float]]:
    """GPUs used after placing every job (seeded random order) on an open-ended fleet."""
    order = list(jobs)
    random.Random(seed).shuffle(order)
    placer = Placed(MigFleet(product, strategy_scorer(strategy)), clock)
    for job in order:
        if placer.place(job) is None:
            raise ValueError(f"{job.name} does not fit on an empty {product.name}")
    return placer.fleet.gpus_used, placer.decision_ms


def _events(jobs: Sequence[MigJob]) -> list[tuple[int, int, int]]:
    """``(time, 0 departure | 1 arrival, job index)``, sorted; untimed jobs are left out."""
    events = []
    for index, job in enumerate(jobs):
        if job.creation_time is None:
            continue
        events.append((job.creation_time, 1, index))
        if job.deletion_time is not None:
            events.append((job.deletion_time, 0, index))
    return sorted(events)


def peak_lower_bound(jobs: Sequence[MigJob], product: Product) -> int:
    """The most GPUs the jobs alive at one time need: compute, memory and >half-GPU counts."""
    compute = memory = big = peak = 0
    for _, arrival, index in _events(jobs):
        sign = 1 if arrival else -1
        for profile_id in jobs[index].profile_ids:
            profile = product.profile(profile_id)
            assert profile is not None
            compute += sign * profile.compute_slices
            memory += sign * profile.memory_slices
            big += sign * (2 * profile.compute_slices > product.compute_slice_count)
        need = max(
            math.ceil(compute / product.compute_slice_count),
            math.ceil(memory / product.memory_slice_count),
            big,
        )
        peak = max(peak, need)
    return peak


class DecisionMs(TypedDict):
    p50: float
    p99: float


def _decisions(times: Sequence[float]) -> DecisionMs:
    return DecisionMs(p50=round(percentile(times, 50), 4), p99=round(percentile(times, 99), 4))


class ChurnResult(TypedDict):
    gpus: int
    arrived: int
    accepted: int
    acceptance_percent: float
    rank_checks: int
    rank_mismatches: int
    rank_decision_ms: DecisionMs


def churn(
    jobs: Sequence[MigJob],
    product: Product,
    gpu_count: int,
    strategy: str,
    clock: Callable[[], float] | None = None,
    *,
    rank_every: int = 0,
) -> tuple[ChurnResult, list[float]]:
    """Arrivals and departures on ``gpu_count`` GPUs: how many jobs were accepted.

    Every ``rank_every``-th single-instance arrival (0: never) is also decided by
    :func:`fleet.placement.rank` on a snapshot of the fleet, timed, and compared with the fast
    fleet's choice: they must agree.
    """
    placer = Placed(MigFleet(product, strategy_scorer(strategy), gpu_count), clock)
    live: dict[int, list[tuple[int, Instance]]] = {}
    arrived = accepted = checks = mismatches = 0
    rank_ms: list[float] = []
    for _, arrival, index in _events(jobs):
        if not arrival:
            placer.release(live.pop(index, []))
            continue
        arrived += 1
        job = jobs[index]
        if rank_every and arrived % rank_every == 0 and len(job.profile_ids) == 1:
            checks += 1
            mismatches += not _rank_agrees(
                placer.fleet, job.profile_ids[0], strategy, clock, rank_ms
            )
        placed = placer.place(job)
        if placed is not None:
            live[index] = placed
            accepted += 1
    result = ChurnResult(
        gpus=gpu_count,
        arrived=arrived,
        accepted=accepted,
        acceptance_percent=round(100.0 * accepted / arrived, 3) if arrived else 100.0,
        rank_checks=checks,
        rank_mismatches=mismatches,
        rank_decision_ms=_decisions(rank_ms),
    )
    return result, placer.decision_ms


def _rank_agrees(
    fleet: MigFleet,
    profile_id: int,
    strategy: str,
    clock: Callable[[], float] | None,
    times: list[float],
) -> bool:
    snapshot = as_snapshot(fleet)
    start = clock() if clock is not None else 0.0
    best = rank(snapshot, MigRequest(profile_id), strategy=_strategy(strategy)).best
    if clock is not None:
        times.append((clock() - start) * 1000.0)
    profile = fleet.product.profile(profile_id)
    fast = fleet.fit(profile) if profile is not None else None
    if best is None or fast is None:
        return best is None and fast is None
    return (best.gpu_id, best.new_instance) == fast


def _strategy(name: str) -> Strategy:
    for strategy in STRATEGIES:
        if strategy == name:
            return strategy
    raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")


class MigRun(TypedDict):
    strategy: str
    seed: int
    gpus_used: int
    gap_percent: float
    churn: list[ChurnResult]
    decision_ms: DecisionMs
    churn_decision_ms: DecisionMs


class OfflineRepack(TypedDict):
    gpus_used: int
    lower_bound: int
    optimal: bool
    solver: str


class MigReport(TypedDict):
    product: str
    jobs: int
    instances: int
    profiles: dict[str, int]
    lower_bound: int
    offline: OfflineRepack
    churn_fleets: list[int]
    results: list[MigRun]


def run_mig(
    pods: Sequence[TracePod],
    product: Product,
    *,
    strategies: Sequence[str] = MIG_STRATEGIES,
    seeds: Sequence[int] = (42,),
    fleets: Sequence[int] = (),
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    clock: Callable[[], float] | None = None,
    rank_every: int = RANK_EVERY,
) -> MigReport:
    """The whole MIG benchmark: packing per (strategy, seed), churn per strategy.

    Args:
        pods: the trace.
        product: a MIG product.
        strategies: :func:`fleet.placement.rank` strategies.
        seeds: seeds of the packing order (churn follows the trace's times).
        fleets: churn fleet sizes; default the peak lower bound and 80 % of it (none when no
            job has a creation time).
        time_limit_s: CP-SAT limit for the offline repack.
        clock: seconds, monotonic; when given, decisions are timed.
        rank_every: in churn, check every so many arrivals against ``rank`` (0: never).
    """
    jobs = mig_jobs(pods, product)
    flat = [pid for job in jobs for pid in job.profile_ids]
    offline = repack(flat, product, time_limit_s)
    bound = offline.lower_bound
    if not any(job.creation_time is not None for job in jobs):
        fleets = ()  # no creation/deletion times (the multigpu traces): no churn to replay
    elif not fleets:
        peak = peak_lower_bound(jobs, product)
        fleets = (max(1, peak), max(1, round(TIGHT_FLEET * peak)))
    runs: list[MigRun] = []
    for strategy in strategies:
        churned = [churn(jobs, product, n, strategy, clock, rank_every=rank_every) for n in fleets]
        churn_times = [t for _, times in churned for t in times]
        for seed in seeds:
            used, times = pack_online(jobs, product, strategy, seed, clock)
            runs.append(
                MigRun(
                    strategy=strategy,
                    seed=seed,
                    gpus_used=used,
                    gap_percent=round(100.0 * (used - bound) / bound, 3) if bound else 0.0,
                    churn=[result for result, _ in churned],
                    decision_ms=_decisions(times),
                    churn_decision_ms=_decisions(churn_times),
                )
            )
    names = {p.id: p.name for p in product.profiles}
    counts = Counter(names[pid] for pid in flat)
    return MigReport(
        product=product.key,
        jobs=len(jobs),
        instances=len(flat),
        profiles=dict(sorted(counts.items())),
        lower_bound=bound,
        offline=OfflineRepack(
            gpus_used=offline.gpus_used,
            lower_bound=offline.lower_bound,
            optimal=offline.optimal,
            solver=offline.solver,
        ),
        churn_fleets=list(fleets),
        results=runs,
    )
