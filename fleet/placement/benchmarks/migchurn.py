"""A MIG churn scenario that tells placement strategies apart.

The trace's sharing pods (``gpu_milli`` < 1000) become MIG replicas of the smallest profile whose
compute covers their share (:func:`fleet.placement.benchmarks.migbench.profile_for_milli`), so
the small profiles stay in the mix; they arrive at ``creation_time`` and leave at
``deletion_time`` (departures first on ties) on a fixed fleet of one product, all GPUs in MIG
mode, eight to a host. Every decision is :func:`fleet.placement.rank` on the fleet's snapshot,
as auto-placement makes it, with the product's semantics:

* a replica takes a free partition of its profile, else a new instance in free slices; busy
  instances are never touched; a replica that fits nowhere is rejected (no retry);
* a departing replica leaves its partition idle (the product evicts, the partition stays), and
  the same profile can reuse it;
* a GPU left with no busy instance is re-laid out: its idle partitions are destroyed, as the
  operator (or the defrag plan) may do to an idle GPU, never to a busy one.

The ``product`` strategy learns the mix online from the arrivals so far. The fleet is sized so
that first-fit accepts less than :data:`FIRST_FIT_BELOW` percent of the arrivals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypedDict

from fleet.mig import Product
from fleet.placement.benchmarks.migbench import profile_for_milli
from fleet.placement.benchmarks.replay import percentile
from fleet.placement.benchmarks.trace import TracePod
from fleet.placement.fit import STRATEGIES, Strategy, Target, rank
from fleet.placement.mix import MixLearner, shape_of
from fleet.placement.snapshot import FleetSnapshot, GpuState, HostState, MigPartition, MigRequest

CHURN_STRATEGIES: tuple[Strategy, ...] = ("product", "best_fit", "first_fit")
FIRST_FIT_BELOW = 90.0
GPUS_PER_HOST = 8


@dataclass(frozen=True, slots=True)
class ChurnJob:
    """One sharing pod as a MIG replica of ``profile_id``, with its lifetime."""

    name: str
    profile_id: int
    creation_time: int
    deletion_time: int | None


def sharing_jobs(pods: Sequence[TracePod], product: Product) -> tuple[ChurnJob, ...]:
    """The trace's timed sharing pods as MIG replicas on ``product``."""
    return tuple(
        ChurnJob(
            pod.name,
            profile_for_milli(product, pod.gpu_milli).id,
            pod.creation_time,
            pod.deletion_time,
        )
        for pod in pods
        if pod.is_sharing and pod.creation_time is not None
    )


def events(jobs: Sequence[ChurnJob]) -> list[tuple[int, int, int]]:
    """``(time, 0 departure | 1 arrival, job index)``, sorted."""
    out = []
    for index, job in enumerate(jobs):
        out.append((job.creation_time, 1, index))
        if job.deletion_time is not None:
            out.append((job.deletion_time, 0, index))
    return sorted(out)


class MigChurnFleet:
    """``gpu_count`` MIG GPUs of ``product`` as a snapshot, changed one replica at a time."""

    def __init__(self, product: Product, gpu_count: int) -> None:
        self.product = product
        hosts = tuple(HostState(h) for h in range((gpu_count + GPUS_PER_HOST - 1) // GPUS_PER_HOST))
        gpus = tuple(
            GpuState(i, i // GPUS_PER_HOST, product.key, product.memory_mib, "mig", product=product)
            for i in range(gpu_count)
        )
        self.snapshot = FleetSnapshot(hosts, gpus)
        self._next_id = 1

    def place(self, target: Target, profile_id: int) -> tuple[int, int]:
        """Apply a ranking's target; the GPU and partition the replica now holds."""
        gpu = self._gpu(target.gpu_id)
        if target.partition_id is not None:
            partition_id = target.partition_id
            partitions = tuple(
                replace(p, occupied=True) if p.id == partition_id else p for p in gpu.partitions
            )
        else:
            assert target.new_instance is not None
            partition_id = self._next_id
            self._next_id += 1
            created = MigPartition(partition_id, profile_id, target.new_instance.start, True)
            partitions = (*gpu.partitions, created)
        self._set(replace(gpu, partitions=partitions))
        return gpu.id, partition_id

    def release(self, gpu_id: int, partition_id: int) -> None:
        """The replica leaves; an idle GPU is re-laid out (its idle partitions destroyed)."""
        gpu = self._gpu(gpu_id)
        partitions = tuple(
            replace(p, occupied=False) if p.id == partition_id else p for p in gpu.partitions
        )
        if not any(p.occupied for p in partitions):
            partitions = ()
        self._set(replace(gpu, partitions=partitions))

    def _gpu(self, gpu_id: int) -> GpuState:
        gpu = self.snapshot.gpu(gpu_id)
        assert gpu is not None
        return gpu

    def _set(self, gpu: GpuState) -> None:
        self.snapshot = self.snapshot.with_changes(gpus=(gpu,))


class DecisionMs(TypedDict):
    p50: float
    p99: float


class ChurnRun(TypedDict):
    strategy: str
    gpus: int
    arrived: int
    accepted: int
    acceptance_percent: float
    decision_ms: DecisionMs


def run_churn(
    jobs: Sequence[ChurnJob],
    product: Product,
    gpu_count: int,
    strategy: Strategy,
    clock: Callable[[], float] | None = None,
) -> ChurnRun:
    """Replay the jobs' arrivals and departures on ``gpu_count`` GPUs with one strategy."""
    fleet = MigChurnFleet(product, gpu_count)
    learner = MixLearner()
    live: dict[int, tuple[int, int]] = {}
    arrived = accepted = 0
    times: list[float] = []
    for _, arrival, index in events(jobs):
        if not arrival:
            held = live.pop(index, None)
            if held is not None:
                fleet.release(*held)
            continue
        arrived += 1
        request = MigRequest(jobs[index].profile_id)
        learner.observe(shape_of(MigRequest(_name(product, jobs[index].profile_id))))
        start = clock() if clock is not None else 0.0
        best = rank(fleet.snapshot, request, strategy=strategy, mix=learner.mix).best
        if clock is not None:
            times.append((clock() - start) * 1000.0)
        if best is not None:
            live[index] = fleet.place(best, jobs[index].profile_id)
            accepted += 1
    return ChurnRun(
        strategy=strategy,
        gpus=gpu_count,
        arrived=arrived,
        accepted=accepted,
        acceptance_percent=round(100.0 * accepted / arrived, 3) if arrived else 100.0,
        decision_ms=DecisionMs(
            p50=round(percentile(times, 50), 4), p99=round(percentile(times, 99), 4)
        ),
    )


def _name(product: Product, profile_id: int) -> str:
    profile = product.profile(profile_id)
    return profile.name if profile is not None else str(profile_id)


def fleet_for_first_fit(
    jobs: Sequence[ChurnJob], product: Product, below: float = FIRST_FIT_BELOW
) -> int:
    """The largest fleet on which first-fit accepts less than ``below`` percent of arrivals."""
    peak = max(1, peak_gpus(jobs, product))
    for gpu_count in range(peak, 0, -1):
        if run_churn(jobs, product, gpu_count, "first_fit")["acceptance_percent"] < below:
            return gpu_count
    return 1


def peak_gpus(jobs: Sequence[ChurnJob], product: Product) -> int:
    """GPUs the jobs alive at the busiest moment fill, by memory slices (a lower bound)."""
    used = peak = 0
    for _, arrival, index in events(jobs):
        profile = product.profile(jobs[index].profile_id)
        assert profile is not None
        used += profile.memory_slices if arrival else -profile.memory_slices
        peak = max(peak, used)
    return -(-peak // product.memory_slice_count)


def fluid_acceptance(jobs: Sequence[ChurnJob], product: Product, gpu_count: int) -> float:
    """Acceptance, in percent, when a job is accepted whenever the jobs alive would still fit
    the fleet's compute slices, memory slices and whole-GPU count (instances of more than half a
    GPU) if they could be repacked at will: an optimistic ceiling for any placement strategy."""
    alive: set[int] = set()
    compute = memory = big = arrived = accepted = 0
    for _, arrival, index in events(jobs):
        profile = product.profile(jobs[index].profile_id)
        assert profile is not None
        large = int(2 * profile.compute_slices > product.compute_slice_count)
        if not arrival:
            if index in alive:
                alive.remove(index)
                compute -= profile.compute_slices
                memory -= profile.memory_slices
                big -= large
            continue
        arrived += 1
        if (
            compute + profile.compute_slices <= product.compute_slice_count * gpu_count
            and memory + profile.memory_slices <= product.memory_slice_count * gpu_count
            and big + large <= gpu_count
        ):
            alive.add(index)
            accepted += 1
            compute += profile.compute_slices
            memory += profile.memory_slices
            big += large
    return round(100.0 * accepted / arrived, 3) if arrived else 100.0


class ChurnReport(TypedDict):
    product: str
    jobs: int
    profiles: dict[str, int]
    peak_gpus: int
    gpus: int
    fluid_ceiling_percent: float
    runs: list[ChurnRun]


def run_mig_churn(
    pods: Sequence[TracePod],
    product: Product,
    *,
    strategies: Sequence[Strategy] = CHURN_STRATEGIES,
    gpu_count: int | None = None,
    clock: Callable[[], float] | None = None,
) -> ChurnReport:
    """The scenario: size the fleet (unless given), then replay it with every strategy."""
    jobs = sharing_jobs(pods, product)
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}")
    size = gpu_count if gpu_count is not None else fleet_for_first_fit(jobs, product)
    counts: dict[str, int] = {}
    for job in jobs:
        name = _name(product, job.profile_id)
        counts[name] = counts.get(name, 0) + 1
    return ChurnReport(
        product=product.key,
        jobs=len(jobs),
        profiles=dict(sorted(counts.items())),
        peak_gpus=peak_gpus(jobs, product) if jobs else 0,
        gpus=size,
        fluid_ceiling_percent=fluid_acceptance(jobs, product, size),
        runs=[run_churn(jobs, product, size, s, clock) for s in strategies],
    )
