"""The layout advisor on the MIG variants of the traces (``bench_placement --mig P --advisor``).

The trace's single-instance MIG jobs (:func:`fleet.placement.benchmarks.migbench.mig_jobs`; a
multi-GPU pod is all or nothing, not a replica) on the tight churn fleet (80 % of their peak
lower bound), in two states:

* ``reshape``: the jobs arrive and leave, placed first-fit; a job that does not fit waits
  (retried after every departure) until it leaves. The state taken is the moment the most
  waiting instances would fit the free slices if the fleet were repacked: the fleet's instances
  (one running replica each) and the waiting ones.
* ``cold``: every job alive at the compute peak waits, on empty GPUs.

Each goes to :func:`fleet.placement.advisor.solver.advise`: how close to the solver's bound it
gets, and how fast.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypedDict

from fleet.mig import Instance, Product
from fleet.placement.advisor.solver import advise
from fleet.placement.advisor.values import AdvisorGpu, ExistingInstance, WaitingMig
from fleet.placement.benchmarks.migbench import (
    TIGHT_FLEET,
    MigJob,
    Placed,
    _events,
    mig_jobs,
    peak_lower_bound,
)
from fleet.placement.benchmarks.migfleet import MigFleet, strategy_scorer
from fleet.placement.benchmarks.trace import TracePod


class AdvisorRun(TypedDict):
    scenario: str
    product: str
    gpus: int
    running_replicas: int
    waiting_replicas: int
    waiting: dict[str, int]
    placed_replicas: int
    moved_replicas: int
    gpus_changed: int
    objective: int
    bound: int
    gap_percent: float
    status: str
    time_s: float


def peak_waiting_state(
    jobs: Sequence[MigJob], product: Product, gpu_count: int
) -> tuple[list[tuple[Instance, ...]], list[int]]:
    """The first-fit fleet's layouts and the waiting instances (profile ids) at the moment the
    most waiting instances would fit the fleet's free compute and memory slices (where a repack
    could help most). Waiting jobs are retried, in arrival order, after every departure."""
    placer = Placed(MigFleet(product, strategy_scorer("first_fit"), gpu_count))
    live: dict[int, list[tuple[int, Instance]]] = {}
    waiting: dict[int, MigJob] = {}
    best: tuple[tuple[int, int], list[tuple[Instance, ...]], list[int]] = ((0, 0), [], [])
    for _, arrival, index in _events(jobs):
        if not arrival:
            placer.release(live.pop(index, []))
            waiting.pop(index, None)
            for other, job in list(waiting.items()):
                placed = placer.place(job)
                if placed is not None:
                    live[other] = placed
                    del waiting[other]
            continue
        placed = placer.place(jobs[index])
        if placed is None:
            waiting[index] = jobs[index]
        else:
            live[index] = placed
        flat = [pid for job in waiting.values() for pid in job.profile_ids]
        score = (_fluid_fit(product, placer.fleet.layouts, flat), len(flat))
        if score > best[0]:
            best = (score, list(placer.fleet.layouts), flat)
    return best[1], best[2]


def _fluid_fit(
    product: Product, layouts: Sequence[tuple[Instance, ...]], waiting: list[int]
) -> int:
    """How many waiting instances (smallest first) the free compute and memory slices hold."""
    compute = memory = 0
    for layout in layouts:
        profiles = [product.profile(i.profile_id) for i in layout]
        compute += product.compute_slice_count - sum(p.compute_slices for p in profiles if p)
        memory += product.memory_slice_count - sum(p.memory_slices for p in profiles if p)
    fit = 0
    for profile in sorted(
        (p for p in map(product.profile, waiting) if p is not None),
        key=lambda p: (p.compute_slices, p.memory_slices),
    ):
        if profile.compute_slices > compute or profile.memory_slices > memory:
            break
        compute -= profile.compute_slices
        memory -= profile.memory_slices
        fit += 1
    return fit


def peak_alive(jobs: Sequence[MigJob], product: Product) -> list[int]:
    """The profile ids of the jobs alive when the most compute slices are alive."""
    alive: dict[int, MigJob] = {}
    compute = 0
    best: tuple[int, list[int]] = (-1, [])
    for _, arrival, index in _events(jobs):
        sign = 1 if arrival else -1
        if arrival:
            alive[index] = jobs[index]
        else:
            alive.pop(index, None)
        for pid in jobs[index].profile_ids:
            profile = product.profile(pid)
            compute += sign * (profile.compute_slices if profile else 0)
        if compute > best[0]:
            best = (compute, [pid for job in alive.values() for pid in job.profile_ids])
    return best[1]


def run_advisor(
    pods: Sequence[TracePod],
    product: Product,
    *,
    gpu_count: int | None = None,
    time_limit_s: float = 10.0,
    clock: Callable[[], float] | None = None,
) -> list[AdvisorRun]:
    """The advisor on two states of the tight fleet (80 % of the peak lower bound): ``reshape``
    (first-fit's layouts when the most waiting replicas would fit a repack) and ``cold`` (every
    replica alive at the compute peak waiting, on empty GPUs)."""
    # Replicas are placed one by one: a multi-GPU pod (all or nothing) is not a replica.
    jobs = [job for job in mig_jobs(pods, product) if len(job.profile_ids) == 1]
    if gpu_count is None:
        gpu_count = max(1, round(TIGHT_FLEET * peak_lower_bound(jobs, product)))
    layouts, waiting_ids = peak_waiting_state(jobs, product, gpu_count)
    cold = peak_alive(jobs, product)
    return [
        _run("reshape", product, layouts, waiting_ids, time_limit_s, clock),
        _run("cold", product, [() for _ in range(gpu_count)], cold, time_limit_s, clock),
    ]


def _run(
    scenario: str,
    product: Product,
    layouts: Sequence[tuple[Instance, ...]],
    waiting_ids: Sequence[int],
    time_limit_s: float,
    clock: Callable[[], float] | None,
) -> AdvisorRun:
    gpus = [
        AdvisorGpu(index, product, tuple(ExistingInstance(i.profile_id, i.start, 1) for i in lay))
        for index, lay in enumerate(layouts)
    ]
    names = {p.id: p.name for p in product.profiles}
    counts = Counter(waiting_ids)
    waiting = [WaitingMig(names[pid], pid, n) for pid, n in sorted(counts.items())]
    advice = advise(gpus, waiting, time_limit_s=time_limit_s, clock=clock)
    return AdvisorRun(
        scenario=scenario,
        product=product.key,
        gpus=len(gpus),
        running_replicas=sum(g.busy_replicas for g in gpus),
        waiting_replicas=len(waiting_ids),
        waiting={names[pid]: n for pid, n in sorted(counts.items())},
        placed_replicas=advice.placed_total,
        moved_replicas=advice.moved_replicas,
        gpus_changed=sum(1 for g in advice.gpus if g.changed),
        objective=advice.objective,
        bound=advice.bound,
        gap_percent=advice.gap_percent,
        status=advice.status,
        time_s=advice.time_s,
    )
