"""``bench_fairshare``: hard caps against borrowing and reclaim, on the openb trace's churn.

A discrete-event simulation on a simulated clock, calling the product's own rules at every
decision, the same functions the services call against the database:

* placement: :func:`fleet.placement.rank` (the ``product`` strategy) on the fleet's snapshot;
* admission: :func:`fleet.placement.sharing.sharing_verdict` with the fleet's free compute
  slices and :func:`~fleet.placement.sharing.deserved_need` of the other teams (what
  :func:`fleet.allocations.borrowing.admission` reads from the database);
* the queue: :func:`fleet.placement.fairshare.queue_order` by
  :func:`~fleet.placement.fairshare.team_shares` of decayed use;
* reclaim: :func:`fleet.placement.reclaim.reclaim_plan` for the entitled waiting replicas that
  only moving or stopping borrowed replicas would place, as
  :func:`fleet.sharing.reclaiming.reclaims_start` walks the queue: up to 8 at once, on
  disjoint GPUs.

**The fleet**: ``gpus`` H100 80GB GPUs in MIG mode, eight to a host. A replica takes a free
partition of its profile or a new instance; a GPU left with no busy instance is re-laid out
(its idle partitions destroyed), as in the MIG churn benchmark
(:mod:`fleet.placement.benchmarks.migchurn`).

**The load**: every GPU pod of an openb trace (``openb_pod_list_default.csv``) with its
``creation_time`` and ``deletion_time``: a sharing pod as a MIG replica of the smallest profile
whose compute covers its ``gpu_milli``, a whole-GPU pod as ``7g.80gb`` replicas, one per GPU.
Arrivals from the dense part of the trace (from its 1st percentile of creation times; pods
created before and still alive arrive at time 0) are compressed into ``window_s``; lifetimes are
scaled by one factor, found by bisection, so that the offered load (what every pod alive would
hold with unlimited capacity), averaged over the window, is ``load`` times the fleet, and capped
at the window. **Teams** by a fixed rule: the pod's name hashed (CRC-32) to a number in [0, 1),
which falls in one team's span of the cumulated deserved shares, so each team offers about its
share of the load.

**Phases**: thirds of the window. In the second, team A (``teams[0]``) is idle: its replicas
end as the phase starts, what it had waiting is withdrawn, its arrivals are dropped, and the
others, past their deserved shares, borrow. In the third, A's arrivals come back.

**Timing** (the product's defaults): a replica is placed when it arrives if it fits and its team
may hold it (a scale-out of an auto-placed deployment); waiting replicas are placed from the
queue every ``queue_every_s`` (beat's ``place-queue``, 5 s:
:func:`fleet.sharing.placing.queue_place`, at most 20 attempts a run, in queue order) and as
soon as a replica's departure frees capacity (or a second later when kicked less than a second
before); reclaim runs every ``reclaim_every_s`` (3 s) and as soon as a replica is left waiting
for capacity (on arrival, or by the queue's run; a second later when kicked less than a second
before: :func:`fleet.core.jobs.reclaim_after_commit`), up to ``reclaim_concurrency`` (8) at
once, each planned away from the GPUs of those running and touching none of them, a sweep
planning for at most 20 entitled claimants or 2 s of this machine's time (the product's bounds).
A reclaim's claimant counts as placed ``move_s`` after the reclaim starts when it moved replicas
(make-before-break: the new copy is started and ready before the old one goes) and ``stop_s``
after when it stopped some (drained from the balancer, then SIGTERM); the simulation applies the
plan's capacity changes at once. A stopped replica returns to the queue with the rest of its
lifetime. A reclaim that no longer places its claimant is failed, and that claimant is left
alone for ``reclaim_retry_s``.

**What would it take?** Every ``wit_every_s``, for the first ``wit_per_sample`` waiting replicas
in queue order: the planners' answer, timed in process (the API's own latency is
``bench_wit``'s), ranked by :func:`fleet.placement.wit.rank_plans`, as
:func:`fleet.sharing.wit.compute_answer` finds them; its top plan is applied
``wit_apply_after_s`` later (a person reading it and confirming: an answer served is always for
the fleet as it is then, by its fingerprint), as its API requests would be taken then
(:meth:`Simulation._wit_outcome`), unless the replica was placed meanwhile (even if a reclaim
stopped it again before then: ``wit_placed_then_stopped`` lists those). The simulation goes on
as if nobody had applied it. As the product's refresh does (``FLEET_QUEUE_DEFRAG``), a ``moves``
answer (no quota change) for the replica heading the queue's run among those waiting for
capacity is carried out by the engine, one at a time and away from the GPUs of the reclaims
running: its moves, then the replica placed ``move_s`` later; the rest of the sample is answered
on the fleet after them (``--no-queue-defrag`` turns it off).

**Modes**: ``hard_caps``: each team's deserved share is its cap (Fleet before sharing);
``fair_share``: the deserved share with a limit of the whole fleet, so a team borrows what
nobody's deserved share needs, and reclaim takes it back.
"""

from __future__ import annotations

import heapq
import math
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from fleet.mig import Product
from fleet.placement.benchmarks.migbench import profile_for_milli
from fleet.placement.benchmarks.replay import percentile
from fleet.placement.benchmarks.trace import MILLI, TracePod
from fleet.placement.defrag import Move, MovePlan, plan_moves
from fleet.placement.fairshare import UseInterval, Waiting, queue_order, team_shares
from fleet.placement.fit import Target, rank
from fleet.placement.quota import Quota, Usage, plus
from fleet.placement.reclaim import Borrowed, ReclaimPlan, plan_gpus, reclaim_plan
from fleet.placement.sharing import Sharing, deserved_need, sharing_verdict
from fleet.placement.simulate import apply_target
from fleet.placement.snapshot import FleetSnapshot, GpuState, HostState, MigPartition, MigRequest
from fleet.placement.wit import Plan, PlanKind, rank_plans

Mode = Literal["hard_caps", "fair_share"]
MODES: tuple[Mode, ...] = ("hard_caps", "fair_share")
GPUS_PER_HOST = 8
MAX_TRIED = 20  # entitled claimants one reclaim sweep plans for (fleet.sharing.reclaiming)
MAX_ATTEMPTS = 20  # placements one queue run tries (fleet.sharing.placing)
MAX_PROMISED = 4  # moves plans the queue's walk promises the replicas ahead (fleet.sharing.wit)
PLAN_BUDGET_S = 2.0  # planning time one reclaim sweep takes at most (fleet.sharing.reclaiming)

GOALS = {
    "allocation_gain_pp": 15.0,
    "reclaim_p99_s": 10.0,
    "stopped_while_free": 0,
}


@dataclass(frozen=True)
class FairshareOptions:
    gpus: int = 1024
    shares: tuple[float, ...] = (0.30, 0.25, 0.20, 0.15, 0.10)
    load: float = 1.3
    window_s: float = 7200.0
    queue_every_s: float = 5.0
    reclaim_every_s: float = 3.0
    reclaim_retry_s: float = 60.0
    reclaim_concurrency: int = 8
    reclaim_kick: bool = True
    move_s: float = 5.0
    stop_s: float = 3.0
    min_runtime_s: float = 0.0
    half_life_s: float = 7 * 86400.0
    sample_every_s: float = 30.0
    wit_every_s: float = 120.0
    wit_per_sample: int = 4
    wit_apply_after_s: float = 5.0
    queue_defrag: bool = True


@dataclass(frozen=True)
class Pod:
    """One replica of the trace: its team, profile, arrival and lifetime (simulated seconds)."""

    name: str
    team: int
    profile_id: int
    slices: int
    arrival_s: float
    life_s: float


def team_of(name: str, shares: Sequence[float]) -> int:
    """The documented rule: CRC-32 of the pod's name, scaled to [0, 1), in cumulated shares."""
    u = zlib.crc32(name.encode()) / 2**32
    total = sum(shares)
    edge = 0.0
    for team, share in enumerate(shares):
        edge += share / total
        if u < edge:
            return team
    return len(shares) - 1


def _raw(pods: Iterable[TracePod], product: Product) -> list[tuple[str, int, int, int, int]]:
    """``(name, profile id, slices, creation, deletion)`` per replica of the timed GPU pods."""
    whole = max(product.profiles, key=lambda p: (p.compute_slices, p.memory_slices))
    out = []
    for pod in pods:
        if pod.num_gpu <= 0 or pod.creation_time is None or pod.deletion_time is None:
            continue
        profile = whole if pod.gpu_milli >= MILLI else profile_for_milli(product, pod.gpu_milli)
        for n in range(pod.num_gpu if pod.gpu_milli >= MILLI else 1):
            out.append(
                (
                    f"{pod.name}#{n}",
                    profile.id,
                    profile.compute_slices,
                    pod.creation_time,
                    pod.deletion_time,
                )
            )
    return out


def _offered(
    raw: Sequence[tuple[str, int, int, int, int]], t0: int, k: float, f: float, w: float
) -> float:
    """Mean compute slices the replicas would hold over ``[0, w]``, unlimited capacity."""
    total = 0.0
    for _, _, slices, created, deleted in raw:
        start = max(created, t0)
        if deleted <= start and created < t0:
            continue
        arrival = (start - t0) / k
        if arrival > w:
            continue
        life = min(max(deleted - start, 1) * f, w)
        total += slices * max(0.0, min(w, arrival + life) - arrival)
    return total / w


def load_pods(
    pods: Sequence[TracePod], product: Product, options: FairshareOptions
) -> tuple[list[Pod], dict[str, float]]:
    """The trace as replicas on the simulated clock, and how it was scaled."""
    raw = _raw(pods, product)
    if not raw:
        raise ValueError("the trace has no GPU pods with creation and deletion times")
    created = sorted(r[3] for r in raw)
    t0 = created[len(created) // 100]
    t_end = created[-1]
    k = max((t_end - t0) / options.window_s, 1e-9)
    target = options.load * options.gpus * product.compute_slice_count
    lo, hi = 1e-4, 1e3
    for _ in range(60):  # bisection on the lifetime factor (the offered load grows with it)
        mid = math.sqrt(lo * hi)
        if _offered(raw, t0, k, mid, options.window_s) < target:
            lo = mid
        else:
            hi = mid
    f = math.sqrt(lo * hi)
    out = []
    for name, profile_id, slices, c, d in raw:
        start = max(c, t0)
        if d <= start and c < t0:
            continue
        arrival = (start - t0) / k
        if arrival > options.window_s:
            continue
        life = min(max(d - start, 1) * f, options.window_s)
        team = team_of(name.split("#")[0], options.shares)
        out.append(Pod(name, team, profile_id, slices, arrival, life))
    out.sort(key=lambda p: (p.arrival_s, p.name))
    scaling = {
        "arrivals_compressed_by": round(k, 2),
        "lifetimes_scaled_by": round(f, 5),
        "offered_load": round(
            _offered(raw, t0, k, f, options.window_s) / (target / options.load), 3
        ),
    }
    return out, scaling


@dataclass
class Job:
    pod: Pod
    waiting_since: float
    left_s: float
    partition: int | None = None
    gpu: int | None = None
    borrowed: bool = False
    started_s: float = 0.0
    placed_at: float | None = None  # the first placement (the wait ends)
    token: int = 0
    entitled_at_arrival: bool = False  # within the deserved share, its team's queue counted
    under_deserved_at_arrival: bool = False  # within it by what the team holds alone
    phase: int = 0
    withdrawn: bool = False
    placed_by: str = ""  # how it was last placed: arrival, queue, reclaim, moved
    placed_s: float = 0.0  # when (a move's time too)


@dataclass
class Reclaim:
    claimant: Job
    moved: int
    stopped: int
    done_at: float
    gpus: frozenset[int] = frozenset()


@dataclass
class Run:
    """The counters and samples of one mode's run."""

    samples: list[tuple[float, int, list[int]]] = field(default_factory=list)
    moved: int = 0
    stopped: int = 0
    stopped_while_free: int = 0
    checking_s: float = 0.0
    """This machine's time spent on the benchmark's own checks (``stopped_while_free``), kept
    out of the sweep's planning budget: the product does not run them."""
    reclaims: int = 0
    reclaims_failed: int = 0
    decisions_ms: list[float] = field(default_factory=list)
    wit_ms: list[float] = field(default_factory=list)
    plans_ms: list[float] = field(default_factory=list)
    wit_kinds: dict[str, int] = field(default_factory=dict)
    wit_applied: int = 0
    wit_placed: int = 0
    wit_outcomes: dict[str, int] = field(default_factory=dict)
    wit_failures: list[dict[str, Any]] = field(default_factory=list)
    wit_placed_then_stopped: list[dict[str, Any]] = field(default_factory=list)
    defrags: int = 0
    """Moves plans the engine carried out for the head of the queue (``FLEET_QUEUE_DEFRAG``)."""
    defrags_failed: int = 0
    defrag_moved: int = 0


class Simulation:
    """One mode's run over the pods."""

    def __init__(
        self, product: Product, pods: Sequence[Pod], options: FairshareOptions, mode: Mode
    ):
        self.product, self.options, self.mode = product, options, mode
        self.pods = pods
        n = options.gpus
        self.capacity = n * product.compute_slice_count
        hosts = tuple(HostState(h) for h in range((n + GPUS_PER_HOST - 1) // GPUS_PER_HOST))
        gpus = tuple(
            GpuState(i, i // GPUS_PER_HOST, product.key, product.memory_mib, "mig", product=product)
            for i in range(n)
        )
        self.snapshot = FleetSnapshot(hosts, gpus)
        self.occupied = 0
        self.teams = len(options.shares)
        deserved = [round(s * self.capacity) for s in options.shares]
        self.sharing = [
            Sharing(
                deserved=Quota(mig_compute_slices=d),
                limit=Quota(mig_compute_slices=self.capacity if mode == "fair_share" else None),
            )
            for d in deserved
        ]
        self.deserved = deserved
        self.used = [0] * self.teams
        self.waiting_slices = [0] * self.teams
        self.waiting: dict[str, Job] = {}
        self.by_partition: dict[int, Job] = {}
        self.jobs: list[Job] = []
        self.jobs_by_name: dict[str, Job] = {}
        self.intervals: list[UseInterval] = []
        self.open: dict[str, tuple[float, float]] = {}
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.next_partition = 1
        self.reclaims: list[Reclaim] = []
        self.defrag_until = -1.0  # the engine's defrag running (one at a time) ends then
        self.defrag_failed_until: dict[str, float] = {}
        self.defrag_gpus: frozenset[int] = frozenset()  # the running defrag's
        self.moves_memo: dict[tuple[int, str | int], tuple[FleetSnapshot, MovePlan]] = {}
        self.failed_until: dict[str, float] = {}
        self.run = Run()
        self.now = 0.0
        self.kicked_at = -1.0
        self.reclaim_kicked_at = -1.0
        self.queue_deferred_until = -1.0
        self.reclaim_deferred_until = -1.0

    # -- the fleet ------------------------------------------------------------------------

    def _gpu(self, gpu_id: int) -> GpuState:
        gpu = self.snapshot.gpu(gpu_id)
        assert gpu is not None
        return gpu

    def _set(self, gpus: Iterable[GpuState]) -> None:
        self.snapshot = self.snapshot.with_changes(gpus=gpus)

    def _occupy(self, job: Job, target: Target) -> None:
        gpu = self._gpu(target.gpu_id)
        if target.partition_id is not None:
            pid = target.partition_id
            parts = tuple(replace(p, occupied=True) if p.id == pid else p for p in gpu.partitions)
        else:
            assert target.new_instance is not None
            pid = self.next_partition
            self.next_partition += 1
            created = MigPartition(pid, job.pod.profile_id, target.new_instance.start, True)
            parts = (*gpu.partitions, created)
        self._set([replace(gpu, partitions=parts)])
        job.partition, job.gpu = pid, gpu.id
        self.by_partition[pid] = job
        self.occupied += job.pod.slices

    def _vacate(self, job: Job) -> None:
        assert job.partition is not None and job.gpu is not None
        gpu = self._gpu(job.gpu)
        pid = job.partition
        parts = tuple(replace(p, occupied=False) if p.id == pid else p for p in gpu.partitions)
        if not any(p.occupied for p in parts):
            parts = ()
        self._set([replace(gpu, partitions=parts)])
        del self.by_partition[pid]
        job.partition = job.gpu = None
        self.occupied -= job.pod.slices

    # -- teams ----------------------------------------------------------------------------

    def _verdict(self, job: Job, gained: Mapping[int, int] | None = None) -> Any:
        """The team's sharing verdict on ``job`` (:func:`fleet.allocations.borrowing.admission`);
        with ``gained``, once each team holds that many slices more (the queue's replicas
        ahead placed: they hold them, wait for them no longer, and the fleet has that much
        less free)."""
        gained = gained or {}
        team = job.pod.team
        sharing = self.sharing[team]
        demand = Usage(mig_compute_slices=job.pod.slices)
        in_use = Usage(mig_compute_slices=self.used[team] + gained.get(team, 0))
        quick = sharing_verdict(sharing, in_use, demand, Usage(), Usage())
        if not quick.borrowed:
            return quick
        others = Usage()
        for t in range(self.teams):
            waiting = self.waiting_slices[t] - gained.get(t, 0)
            if t != team and waiting > 0:
                others = plus(
                    others,
                    deserved_need(
                        self.sharing[t],
                        Usage(mig_compute_slices=self.used[t] + gained.get(t, 0)),
                        Usage(mig_compute_slices=waiting),
                    ),
                )
        free = Usage(mig_compute_slices=self.capacity - self.occupied - sum(gained.values()))
        return sharing_verdict(sharing, in_use, demand, free, others)

    def _entitled(self, job: Job, queued: bool = False, ahead: int = 0) -> bool:
        """Whether the job is within its team's deserved share (what a reclaim asks of a
        claimant); with ``queued``, counting the team's replicas already waiting before it
        too: those come first in the team's queue, so a replica past them is past the share
        until some of the team's work ends; with ``ahead``, once the team holds that many
        more slices."""
        team = job.pod.team
        held = self.used[team] + ahead + (self.waiting_slices[team] if queued else 0)
        verdict = sharing_verdict(
            self.sharing[team],
            Usage(mig_compute_slices=held),
            Usage(mig_compute_slices=job.pod.slices),
            Usage(),
            Usage(),
        )
        return verdict.allowed and not verdict.borrowed

    def _start(self, job: Job, target: Target, borrowed: bool, at: float, by: str) -> None:
        """``job`` holds ``target`` from now; it counts as placed (and runs) from ``at``;
        ``by``: what placed it (an arrival, the queue, a reclaim)."""
        self._occupy(job, target)
        job.placed_by, job.placed_s = by, at
        job.borrowed = borrowed
        job.started_s = at
        self.used[job.pod.team] += job.pod.slices
        if job.pod.name in self.waiting:
            del self.waiting[job.pod.name]
            self.waiting_slices[job.pod.team] -= job.pod.slices
        if job.placed_at is None:
            job.placed_at = at
        job.token += 1
        self.open[job.pod.name] = (at, job.pod.slices / self.product.compute_slice_count)
        self._push(at + job.left_s, "depart", (job, job.token))

    def _stop(self, job: Job, at: float, gone: bool) -> None:
        self._vacate(job)
        self.used[job.pod.team] -= job.pod.slices
        start, rate = self.open.pop(job.pod.name)
        self.intervals.append(UseInterval(job.pod.team, start, at, rate))
        job.token += 1
        job.borrowed = False
        if not gone:  # stopped by a reclaim: back to the queue with the rest of its life
            job.left_s = max(0.0, job.left_s - max(0.0, at - job.started_s))
            job.waiting_since = at
            self._enqueue(job)

    def _enqueue(self, job: Job) -> None:
        self.waiting[job.pod.name] = job
        self.waiting_slices[job.pod.team] += job.pod.slices

    def _try(self, job: Job, by: str) -> bool:
        verdict = self._verdict(job)
        if not verdict.allowed:
            return False
        started = time.perf_counter()
        best = rank(self.snapshot, MigRequest(job.pod.profile_id)).best
        self.run.decisions_ms.append((time.perf_counter() - started) * 1000)
        if best is None:
            return False
        self._start(job, best, verdict.borrowed, self.now, by)
        return True

    # -- the queue and reclaim ------------------------------------------------------------

    def _shares(self) -> dict[int, float]:
        live = [UseInterval(t, s, None, r) for (s, r), t in self._open_teams()]
        return team_shares(
            [*self.intervals, *live],
            now_s=self.now,
            half_life_s=self.options.half_life_s,
            capacity_gpu_eq=float(self.options.gpus),
            weights={},
        )

    def _open_teams(self) -> list[tuple[tuple[float, float], int]]:
        return [(v, self.jobs_by_name[name].pod.team) for name, v in self.open.items()]

    def _queue(self) -> list[Job]:
        if not self.waiting:
            return []
        entries = [
            Waiting(i, 0, job.pod.team, 0, job.waiting_since)
            for i, job in enumerate(self.waiting.values())
        ]
        jobs = list(self.waiting.values())
        return [jobs[q.waiting.deployment_id] for q in queue_order(entries, self._shares())]

    def _place_queue(self) -> None:
        """Beat's ``fleet.place_queue`` (:func:`fleet.sharing.placing.queue_place`): the queue's
        run (:meth:`_queue_run`) on the fleet itself."""
        full = self._queue_run(
            lambda job: self._verdict(job).allowed, lambda job: self._try(job, "queue")
        )
        if full:
            self._kick_reclaim()  # some wait for capacity: reclaim for those entitled now

    def _queue_run(
        self,
        admits: Callable[[Job], bool],
        places: Callable[[Job], bool],
        until: Job | None = None,
        skip: frozenset[str] = frozenset(),
    ) -> bool:
        """The queue's run, in queue order (up to ``until``): at most ``MAX_ATTEMPTS``
        attempts; a request that fit nowhere is not tried again in the run, nor a replica of a
        team its quota refused one as large. ``admits``: its team's sharing lets it in;
        ``places``: it was placed. Whether some request fit nowhere."""
        full: set[int] = set()
        refused: dict[int, int] = {}  # per team, the fewest slices its quota refused
        attempts = 0
        for job in self._queue():
            if job is until:
                break
            if job.pod.name in skip:
                continue
            team = job.pod.team
            if job.pod.slices >= refused.get(team, 1 << 30) or job.pod.profile_id in full:
                continue
            if attempts >= MAX_ATTEMPTS:
                break
            attempts += 1
            if not admits(job):
                refused[team] = min(refused.get(team, 1 << 30), job.pod.slices)
            elif not places(job):
                full.add(job.pod.profile_id)
        return bool(full)

    def _kick(self) -> None:
        """Capacity freed: the queue places at once, unless it was kicked less than a second
        ago; then once that second is over (one deferred run covers the kicks of the hold:
        :func:`fleet.core.jobs.place_queue_after_commit`)."""
        if self.now - self.kicked_at >= 1.0:
            self.kicked_at = self.now
            self._place_queue()
        elif self.now >= self.queue_deferred_until:
            self.queue_deferred_until = self.now + 1.0
            self._push(self.now + 1.0, "kick_queue", None)

    def _kick_reclaim(self) -> None:
        """A replica was left waiting: the reclaim sweep runs at once, unless it was kicked
        less than a second ago; then once that second is over
        (:func:`fleet.core.jobs.reclaim_after_commit`)."""
        if not self.options.reclaim_kick:
            return
        if self.now - self.reclaim_kicked_at >= 1.0:
            self.reclaim_kicked_at = self.now
            self._push(self.now, "kick_sweep", None)  # after this event, as a task would
        elif self.now >= self.reclaim_deferred_until:
            self.reclaim_deferred_until = self.now + 1.0
            self._push(self.now + 1.0, "kick_sweep", None)

    def _borrowed_of_others(self, team: int) -> list[Borrowed]:
        return [
            Borrowed(("mig", pid), job.gpu, 0, job.started_s)
            for pid, job in self.by_partition.items()
            if job.borrowed and job.pod.team != team and job.gpu is not None
        ]

    def _sweep(self) -> None:
        """Beat's reclaim sweep (:func:`fleet.sharing.reclaiming.reclaims_start`): up to
        ``reclaim_concurrency`` reclaims at once, each planned away from the GPUs of those
        running (cordoned, their borrowed replicas left alone) and touching none of them."""
        limit = self.options.reclaim_concurrency
        if self.mode != "fair_share" or len(self.reclaims) >= limit:
            return
        if not any(j.borrowed for j in self.by_partition.values()):
            return
        busy = self._busy()
        planned = 0
        started = time.perf_counter()
        checked = self.run.checking_s
        no_gain: set[tuple[int, int]] = set()  # asks that found no plan in this sweep
        for job in self._queue():
            if self.failed_until.get(job.pod.name, -1.0) > self.now:
                continue
            if not self._entitled(job):
                continue
            asks = (job.pod.team, job.pod.profile_id)
            if asks in no_gain:
                continue
            # The sweep's bounds (fleet.sharing.reclaiming): 20 plans, 2 s of planning.
            spent = time.perf_counter() - started - (self.run.checking_s - checked)
            if planned >= MAX_TRIED or (planned and spent > PLAN_BUDGET_S):
                return
            planned += 1
            planning = time.perf_counter()
            plan, refused = self._reclaim_plan(job, busy)
            self.run.plans_ms.append((time.perf_counter() - planning) * 1000)
            if refused == "no_gain":
                no_gain.add(asks)
            if plan is None:
                continue  # no net gain, fits now (the queue places it), or busy GPUs: the next
            gpus = plan_gpus(plan)
            self._apply(job, plan.action, plan.moves, [b.key[1] for b in plan.stops], gpus)
            busy |= gpus
            if len(self.reclaims) >= limit:
                return

    def _busy(self) -> set[int]:
        """The GPUs reclaims keep away from: the running reclaims' and the running defrag's
        (:func:`fleet.allocations.reclaims.running_reclaims`)."""
        busy: set[int] = set().union(*(r.gpus for r in self.reclaims))
        if self.now < self.defrag_until:
            busy |= self.defrag_gpus
        return busy

    def _reclaim_plan(self, job: Job, busy: set[int]) -> tuple[Any, str]:
        """:func:`fleet.workflows.reclaim.reclaim_start`'s plan for ``job`` (entitled), away
        from the ``busy`` GPUs of the reclaims running: the plan, or ``None`` and the refusal
        (``no_gain``, ``fits_now``, ``gpus_busy``)."""
        snapshot, borrowed = self.snapshot, self._borrowed_of_others(job.pod.team)
        if busy:
            borrowed = [b for b in borrowed if b.gpu_id not in busy]
            snapshot = snapshot.with_changes(
                gpus=[replace(g, cordoned=True) for i in sorted(busy) if (g := snapshot.gpu(i))]
            )
        request = MigRequest(job.pod.profile_id)
        o = self.options
        plan = reclaim_plan(
            snapshot, request, borrowed=borrowed, now_s=self.now, min_runtime_s=o.min_runtime_s
        )
        if plan.action == "none":
            return None, "no_gain"
        if plan.action == "place":
            return None, "fits_now"
        if plan.action == "stop" and busy:
            whole = reclaim_plan(
                self.snapshot,
                request,
                borrowed=self._borrowed_of_others(job.pod.team),
                now_s=self.now,
                min_runtime_s=o.min_runtime_s,
            )
            if whole.action != "stop":
                return None, "gpus_busy"  # moves onto the busy GPUs would spare the stops
        if plan_gpus(plan) & busy:
            return None, "gpus_busy"
        return plan, ""

    def _apply(
        self,
        claimant: Job,
        action: str,
        moves: Sequence[Move],
        stops: list[int],
        gpus: frozenset[int] = frozenset(),
        by: str = "reclaim",
    ) -> float:
        """A reclaim's plan (or, ``by`` ``defrag``, the head of the queue's moves) carried
        out: its moves and stops, then the claimant placed; when it is done."""
        if by == "reclaim":
            self.run.reclaims += 1
        if action == "stop":
            request = MigRequest(claimant.pod.profile_id)
            # Capacity free in bulk: would any plan, moving anyone, have placed it?
            checking = time.perf_counter()
            free = self.capacity - self.occupied >= claimant.pod.slices
            if free and plan_moves(self.snapshot, request).target is not None:
                self.run.stopped_while_free += len(stops)
            self.run.checking_s += time.perf_counter() - checking
        delay = 0.0
        if moves:  # the moves first (a plan of stops may need some: a GPU cleared by both)
            for move in moves:
                self._move(move)
            moved = sum(1 for m in moves if m.occupied)
            if by == "reclaim":
                self.run.moved += moved
            else:
                self.run.defrag_moved += moved
            delay += self.options.move_s
        if stops:
            for pid in stops:
                self._stop(self.by_partition[pid], self.now, gone=False)
            self.run.stopped += len(stops)
            delay += self.options.stop_s
        done = self.now + delay
        verdict = self._verdict(claimant)
        best = rank(self.snapshot, MigRequest(claimant.pod.profile_id)).best
        if verdict.allowed and best is not None:
            self._start(claimant, best, verdict.borrowed, done, by)
        elif by == "defrag":
            self.run.defrags_failed += 1
            self.defrag_failed_until[claimant.pod.name] = self.now + self.options.reclaim_retry_s
        else:
            self.run.reclaims_failed += 1
            self.failed_until[claimant.pod.name] = self.now + self.options.reclaim_retry_s
        if by == "reclaim":
            running = Reclaim(claimant, len(moves), len(stops), done, gpus)
            self.reclaims.append(running)
            self._push(done, "reclaimed", running)
        return done

    def _move(self, move: Move) -> None:
        gpu = self._gpu(move.from_gpu)
        if not move.occupied:  # an idle partition in the way: destroyed
            self._set(
                [
                    replace(
                        gpu,
                        partitions=tuple(p for p in gpu.partitions if p.id != move.allocation_id),
                    )
                ]
            )
            return
        job = self.by_partition[move.allocation_id]
        assert move.to_gpu is not None
        self._vacate(job)
        target = Target(move.to_gpu, move.to_partition_id, move.new_instance, 0.0)
        self._occupy(job, target)
        job.placed_by, job.placed_s = "moved", self.now

    # -- what would it take? --------------------------------------------------------------

    def _wit_sample(self) -> None:
        """What would it take for the first waiting replicas in queue order: each answer timed,
        its top plan applied ``wit_apply_after_s`` later (a person's reading and confirming). A
        replica that fits now, its team's quota allowing, is the engine's to place, as
        :func:`fleet.sharing.wit.wit_refresh` does: the first such of a refresh has the queue
        run at once, the others kick it."""
        ran = False
        for job in self._queue()[: self.options.wit_per_sample]:
            started = time.perf_counter()
            answer = self._wit(job)
            self.run.wit_ms.append((time.perf_counter() - started) * 1000)
            kind = answer[0].kind
            self.run.wit_kinds[kind] = self.run.wit_kinds.get(kind, 0) + 1
            if kind == "place" and not ran:
                ran = True
                self._place_queue()
            elif kind == "place":
                self._kick()
            elif kind == "moves":
                self._queue_defrag(job, answer[0])
            if kind != "wait":
                at = self.now + self.options.wit_apply_after_s
                self._push(at, "wit_apply", (job, answer, self.now))

    def _queue_defrag(self, job: Job, plan: Plan) -> None:
        """``FLEET_QUEUE_DEFRAG`` (:func:`fleet.sharing.wit.wit_refresh`): a ``moves`` answer
        (no quota change) for the head of the queue's run (no replica ahead of it was let in
        and fit nowhere) is carried out by the engine, one at a time, unless its GPUs are a
        running reclaim's or its last one failed within ``reclaim_retry_s``: its moves, then
        the replica placed. The rest of the sample is
        answered on the fleet after it."""
        if not self.options.queue_defrag or plan.changes_policy or self.now < self.defrag_until:
            return
        if self.defrag_failed_until.get(job.pod.name, -1.0) > self.now:
            return  # its last one failed: not again for reclaim_retry_s
        if self._served_before(job)[2]:
            return  # a replica ahead waits for capacity: the head is not this one
        again = self._moves_on(self.snapshot, MigRequest(job.pod.profile_id))
        if again.target is None or not again.moves:
            return  # planned again when started: no plan (or it fits now), not started
        moves, target = again.moves, again.target
        gpus = plan_gpus(ReclaimPlan("move", target, moves))
        if gpus & set().union(*(r.gpus for r in self.reclaims)):
            return
        self.run.defrags += 1
        self.defrag_gpus = gpus
        self.defrag_until = self._apply(job, "move", moves, [], gpus, by="defrag")

    def _wit(self, job: Job) -> tuple[Plan, Target | None, tuple[tuple[int, str], ...]]:
        """The top plan of :func:`fleet.placement.wit.rank_plans` among those
        :func:`fleet.sharing.wit.compute_answer` finds (the layout advisor's reshapes aside:
        the simulation reshapes by itself): ``place`` (``quota`` where its team's sharing
        refuses it: the quota change, then place, on the room its team's replicas ahead leave
        once the change lets them in too), else the fewest ``moves`` (after the quota
        change, where one is needed) and, for a replica its deserved share entitles (once its
        team's entitled replicas ahead in the queue have theirs) that the quota lets in,
        ``stop`` (the reclaim). Where it goes, and the replicas it stops (by
        partition and name)."""
        request = MigRequest(job.pod.profile_id)
        plans: list[tuple[Plan, Target | None, tuple[tuple[int, str], ...]]] = []
        snapshot, gained = self.snapshot, None
        best = rank(snapshot, request).best
        if best is not None:  # unless the queue's replicas ahead take that room first
            snapshot, gained, _ = self._served_before(job)
            best = rank(snapshot, request).best
        blocked = not self._verdict(job, gained if best is not None else None).allowed
        if blocked and best is not None:  # the change lets its team's replicas ahead in first
            snapshot, gained, _ = self._served_before(job, raised=job.pod.team)
            best = rank(snapshot, request).best
        if best is not None:
            kind: PlanKind = "quota" if blocked else "place"
            plans.append((Plan(kind, kind, changes_policy=blocked), best, ()))
        else:  # moves on what the replicas ahead leave, their own moves' room included
            ahead = self._served_before(job, raised=job.pod.team if blocked else None)[0]
            moved = self._moves_on(ahead, request)
            if moved.target is not None:
                n = sum(1 for m in moved.moves if m.occupied)
                to_gpus = sorted({m.to_gpu for m in moved.moves if m.to_gpu is not None})
                details = {"to": to_gpus, "moves": moved.moves, "target": moved.target}
                plan = Plan("moves", "moves", moved=n, changes_policy=blocked, details=details)
                plans.append((plan, moved.target, ()))  # where the moves make room
            if (
                self.mode == "fair_share"
                and not blocked
                and self._entitled(job, ahead=self._claimed_before(job))
            ):
                stop = reclaim_plan(
                    self.snapshot,
                    request,
                    borrowed=self._borrowed_of_others(job.pod.team),
                    now_s=self.now,
                    min_runtime_s=self.options.min_runtime_s,
                )
                if stop.action == "stop" and stop.target is not None:
                    named = tuple(
                        (b.key[1], self.by_partition[b.key[1]].pod.name) for b in stop.stops
                    )
                    n = sum(1 for m in stop.moves if m.occupied)
                    stops = Plan("stop", "stop", stopped=len(named), moved=n)
                    plans.append((stops, stop.target, named))
        if not plans:
            return Plan("wait", "wait"), None, ()
        top = rank_plans([plan for plan, _, _ in plans])[0]
        return next(item for item in plans if item[0] is top)

    def _claimed_before(self, job: Job) -> int:
        """The slices its team's entitled replicas ahead of it in the queue take of the
        deserved share first, as :meth:`fleet.sharing.wit.Context.entitled_in_turn` counts."""
        claimed = 0
        for ahead in self._queue():
            if ahead is job:
                break
            if ahead.pod.team == job.pod.team and self._entitled(ahead, ahead=claimed):
                claimed += ahead.pod.slices
        return claimed

    def _served_before(
        self, job: Job | None, raised: int | None = None, placed: set[str] | None = None
    ) -> tuple[FleetSnapshot, dict[int, int], bool]:
        """The snapshot once the queue's run (:meth:`_queue_run`) has placed the waiting
        replicas ahead of ``job``, each judged by its team's sharing on the holdings the ones
        before it leave, the slices each team gained by them, and whether one of them, let
        in, fit nowhere: :meth:`fleet.sharing.wit.Context.served_before`; with ``raised`` (a
        team), its replicas let in whatever its quota says (a quota change's), after the
        queue's whole next run without it (an admin's change lands after that run)."""
        snapshot, gained = self.snapshot, dict.fromkeys(range(self.teams), 0)
        skip: frozenset[str] = frozenset()
        if raised is not None:
            first: set[str] = set()
            snapshot, gained, _ = self._served_before(None, placed=first)
            skip = frozenset(first)
        promised, waits = 0, False

        def places(ahead: Job) -> bool:
            nonlocal snapshot, promised, waits
            request = MigRequest(ahead.pod.profile_id)
            on, best = snapshot, rank(snapshot, request).best
            if best is None:  # promised its own moves' room, while promises are left
                waits = True
                if promised < MAX_PROMISED:
                    moved = self._moves_on(snapshot, request)
                    if moved.target is not None:
                        promised += 1
                        on, best = moved.snapshot, moved.target
            if best is not None:
                snapshot = apply_target(on, request, best)
                gained[ahead.pod.team] += ahead.pod.slices
                if placed is not None:
                    placed.add(ahead.pod.name)
            return best is not None

        def admits(ahead: Job) -> bool:
            return ahead.pod.team == raised or self._verdict(ahead, gained).allowed

        full = self._queue_run(admits, places, until=job, skip=skip)
        return snapshot, gained, full or waits

    def _moves_on(self, snapshot: FleetSnapshot, request: MigRequest) -> MovePlan:
        """:func:`plan_moves`, memoised per snapshot (the context's memo)."""
        key = (id(snapshot), request.profile)
        found = self.moves_memo.get(key)
        if found is None or found[0] is not snapshot:
            if len(self.moves_memo) >= 256:
                self.moves_memo.clear()
            found = self.moves_memo[key] = (snapshot, plan_moves(snapshot, request))
        return found[1]

    def _wit_apply(
        self,
        job: Job,
        answer: tuple[Plan, Target | None, tuple[tuple[int, str], ...]],
        answered_at: float,
    ) -> None:
        """The top plan's requests, sent now, as the API would take them for an auto-placed
        deployment; it counts as placing the replica when that would succeed now (the
        simulation goes on as if nobody had applied it). Unless it was placed meanwhile, even
        if a reclaim stopped it again since (listed apart). A plan that would fail is recorded
        with what took the room it named meanwhile."""
        if job.partition is not None or job.pod.name not in self.waiting:
            return  # placed (or gone) meanwhile: nothing to apply
        if job.placed_by and job.placed_s >= answered_at:
            # Placed since the answer (the plan carried out: the queue run a place answer
            # triggers), then stopped by a reclaim (only a reclaim stops a replica that is not
            # gone) before the person would apply it: placed meanwhile, as above; kept apart.
            if len(self.run.wit_placed_then_stopped) < 20:
                self.run.wit_placed_then_stopped.append(
                    {
                        "pod": job.pod.name,
                        "team": job.pod.team,
                        "plan": answer[0].kind,
                        "answered_at_s": round(answered_at, 1),
                        "placed_s": round(job.placed_s, 2),
                        "placed_by": job.placed_by,
                    }
                )
            return
        plan, target = answer[0], answer[1]
        self.run.wit_applied += 1
        outcome = self._wit_outcome(job, plan)
        self.run.wit_placed += outcome == "placed"
        key = f"{plan.kind}:{outcome}"
        self.run.wit_outcomes[key] = self.run.wit_outcomes.get(key, 0) + 1
        if outcome != "placed" and len(self.run.wit_failures) < 20:
            self.run.wit_failures.append(self._wit_failure(job, plan, target, answered_at))

    def _wit_failure(
        self, job: Job, plan: Plan, target: Target | None, answered_at: float
    ) -> dict[str, Any]:
        """A failed application: its replica, its plan, and the replicas placed since the
        answer on the GPU the plan named, or where its moves would go (what took the room: an
        arrival, the queue, a reclaim's claimant, a move), with the queue's position of the
        replica now."""
        queue = self._queue()
        gpus = {target.gpu_id} if target is not None else set()
        gpus |= set(plan.details.get("to", ()))
        taken = [
            {"pod": other.pod.name, "team": other.pod.team, "by": other.placed_by, "gpu": other.gpu}
            for other in self.by_partition.values()
            if other.gpu in gpus and other.placed_s >= answered_at
        ]
        return {
            "pod": job.pod.name,
            "team": job.pod.team,
            "slices": job.pod.slices,
            "plan": plan.kind,
            "answered_at_s": round(answered_at, 1),
            "gpu": target.gpu_id if target is not None else None,
            "moves_to": list(plan.details.get("to", ())),
            "taken_since_by": taken,
            "queue_position": next((i for i, j in enumerate(queue) if j is job), None),
            "free_slices": self.capacity - self.occupied,
        }

    def _wit_outcome(self, job: Job, plan: Plan) -> str:
        """``placed``, or why the plan's requests would not place the replica now:

        * ``place``: ``POST .../place``, the engine's target now (``no_room``; ``refused``
          where its team's sharing now refuses it);
        * ``quota``: the quota change (taken as granted: its deserved share raised), then the
          engine's place, else the reclaim the change kicks for it (``no_room``);
        * ``moves``: ``POST .../defrag``, planned again when it is sent (``no_plan``);
        * ``stop``: ``POST /queue/reclaim/{id}``, planned again when it is sent, away from the
          GPUs of the reclaims running (``not_entitled``, ``no_gain``, ``fits_now``: the
          reclaim is refused; ``gpus_busy``: it waits for another reclaim)."""
        request = MigRequest(job.pod.profile_id)
        if not plan.changes_policy and not self._verdict(job).allowed:
            return "refused"
        busy = self._busy()
        if plan.kind in ("place", "quota"):
            if rank(self.snapshot, request).best is not None:
                return "placed"
            if plan.kind == "quota" and self._reclaim_plan(job, busy)[0] is not None:
                return "placed"  # entitled now: the room taken meanwhile is reclaimed for it
            return "no_room"
        if plan.kind == "moves":
            return "placed" if plan_moves(self.snapshot, request).target is not None else "no_plan"
        assert plan.kind == "stop"
        if not self._entitled(job):
            return "not_entitled"
        found, refused = self._reclaim_plan(job, busy)
        return "placed" if found is not None else refused

    # -- the clock ------------------------------------------------------------------------

    def _push(self, at: float, kind: str, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, payload))

    def _phase(self, at: float) -> int:
        return min(2, int(3 * at / self.options.window_s))

    def simulate(self) -> Run:
        o = self.options
        for pod in self.pods:
            if pod.team == 0 and self._phase(pod.arrival_s) == 1:
                continue  # team A is idle in the second phase
            self._push(pod.arrival_s, "arrive", pod)
        self._push(o.window_s / 3, "idle", None)
        for kind, every in (
            ("queue", o.queue_every_s),
            ("sweep", o.reclaim_every_s),
            ("sample", o.sample_every_s),
            ("wit", o.wit_every_s),
        ):
            self._push(every, kind, every)
        while self.events:
            at, _, kind, payload = heapq.heappop(self.events)
            if at > o.window_s:
                break
            self.now = at
            if kind == "arrive":
                job = Job(payload, at, payload.life_s, phase=self._phase(at))
                self.jobs.append(job)
                self.jobs_by_name[payload.name] = job
                job.under_deserved_at_arrival = self._entitled(job)
                job.entitled_at_arrival = self._entitled(job, queued=True)
                if not self._try(job, "arrival"):
                    self._enqueue(job)
                    self._kick_reclaim()  # created into the queue: fleet.core.jobs
            elif kind == "depart":
                job, token = payload
                if token == job.token and job.partition is not None:
                    self._stop(job, at, gone=True)
                    self._kick()
            elif kind == "reclaimed":
                self.reclaims.remove(payload)
            elif kind == "kick_sweep":
                self._sweep()
            elif kind == "kick_queue":
                self._place_queue()
            elif kind == "wit_apply":
                self._wit_apply(*payload)
            elif kind == "idle":  # team A goes idle: its work ends, what waited is withdrawn
                for job in [j for j in self.by_partition.values() if j.pod.team == 0]:
                    self._stop(job, at, gone=True)
                for job in [j for j in self.waiting.values() if j.pod.team == 0]:
                    del self.waiting[job.pod.name]
                    self.waiting_slices[0] -= job.pod.slices
                    job.withdrawn = True
            else:
                if kind == "queue":
                    self._place_queue()
                elif kind == "sweep":
                    self._sweep()
                elif kind == "wit":
                    self._wit_sample()
                else:
                    used = [0] * self.teams
                    for job in self.by_partition.values():
                        used[job.pod.team] += job.pod.slices
                    self.run.samples.append((at, self.occupied, used))
                self._push(at + payload, kind, payload)
        return self.run

    # -- the report -----------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        o, run = self.options, self.run
        end = o.window_s

        def waits(jobs: Iterable[Job]) -> list[float]:
            return [
                (j.placed_at if j.placed_at is not None else end) - j.pod.arrival_s for j in jobs
            ]

        phases = []
        for phase in range(3):
            samples = [s for s in run.samples if self._phase(s[0]) == phase]
            ratio = _mean([100.0 * occ / self.capacity for _, occ, _ in samples])
            held = [
                _mean([used[t] / self.capacity for _, _, used in samples])
                for t in range(self.teams)
            ]
            active = [t for t in range(self.teams) if not (t == 0 and phase == 1)]
            jain = _jain([held[t] / o.shares[t] for t in active])
            phases.append(
                {
                    "allocation_ratio": round(ratio, 2),
                    "share_of_fleet": [round(h, 4) for h in held],
                    "share_over_deserved": [
                        round(held[t] / o.shares[t], 3) for t in range(self.teams)
                    ],
                    "jain_index": round(jain, 4),
                }
            )
        teams = []
        for t in range(self.teams):
            mine = [j for j in self.jobs if j.pod.team == t and not j.withdrawn]
            w = waits(mine)
            teams.append(
                {
                    "team": chr(ord("A") + t),
                    "deserved": o.shares[t],
                    "replicas": len(mine),
                    "never_placed": sum(1 for j in mine if j.placed_at is None),
                    "wait_p50_s": round(percentile(w, 50), 2),
                    "wait_p95_s": round(percentile(w, 95), 2),
                }
            )
        returning = waits(
            j for j in self.jobs if j.pod.team == 0 and j.phase == 2 and j.entitled_at_arrival
        )
        under = waits(
            j for j in self.jobs if j.pod.team == 0 and j.phase == 2 and j.under_deserved_at_arrival
        )
        return {
            "allocation_ratio": phases[1]["allocation_ratio"],
            "phases": phases,
            "teams": teams,
            "returning_team_replicas": len(returning),
            "reclaim_p50_s": round(percentile(returning, 50), 2),
            "reclaim_p95_s": round(percentile(returning, 95), 2),
            "reclaim_p99_s": round(percentile(returning, 99), 2),
            "returning_placed_within_10s": (
                round(sum(1 for w in returning if w <= 10) / len(returning), 4)
                if returning
                else None
            ),
            "returning_by_holdings": {
                "replicas": len(under),
                "p95_s": round(percentile(under, 95), 2),
                "p99_s": round(percentile(under, 99), 2),
            },
            "reclaims": run.reclaims,
            "reclaims_failed": run.reclaims_failed,
            "moved": run.moved,
            "stopped": run.stopped,
            "stopped_while_free": run.stopped_while_free,
            "decision_p95_ms": round(percentile(run.decisions_ms, 95), 2),
            "reclaim_plans": len(run.plans_ms),
            "reclaim_plan_ms": {
                "p50": round(percentile(run.plans_ms, 50), 1) if run.plans_ms else None,
                "p95": round(percentile(run.plans_ms, 95), 1) if run.plans_ms else None,
                "max": round(max(run.plans_ms), 1) if run.plans_ms else None,
            },
            "wit_answers": len(run.wit_ms),
            "wit_p95_ms": round(percentile(run.wit_ms, 95), 1) if run.wit_ms else None,
            "wit_top_plans": dict(sorted(run.wit_kinds.items())),
            "wit_applied": run.wit_applied,
            "wit_outcomes": dict(sorted(run.wit_outcomes.items())),
            "wit_success": round(run.wit_placed / run.wit_applied, 4) if run.wit_applied else None,
            "wit_failures": run.wit_failures,
            "wit_placed_then_stopped": run.wit_placed_then_stopped,
            "queue_defrags": {
                "started": run.defrags,
                "failed": run.defrags_failed,
                "moved": run.defrag_moved,
            },
        }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _jain(values: Sequence[float]) -> float:
    """Jain's fairness index: (Σx)² / (n Σx²); 1 when every x is equal."""
    square = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * square) if square else 1.0


def run_fairshare(
    pods: Sequence[TracePod], product: Product, options: FairshareOptions
) -> dict[str, Any]:
    """Both modes on the same replicas; the JSON report with the goals."""
    replicas, scaling = load_pods(pods, product, options)
    report: dict[str, Any] = {
        "fleet": {"gpus": options.gpus, "product": product.key, "hosts": -(-options.gpus // 8)},
        "trace": {"replicas": len(replicas), **scaling},
        "options": {k: v for k, v in vars(options).items() if k != "shares"},
        "teams": {chr(ord("A") + t): s for t, s in enumerate(options.shares)},
    }
    for mode in MODES:
        started = time.perf_counter()
        sim = Simulation(product, replicas, options, mode)
        sim.simulate()
        report[mode] = {**sim.report(), "seconds": round(time.perf_counter() - started, 1)}
    fair, hard = report["fair_share"], report["hard_caps"]
    gain = fair["allocation_ratio"] - hard["allocation_ratio"]
    report["goals"] = {
        "allocation_gain_pp": {"value": round(gain, 2), "goal": ">= 15", "met": gain >= 15},
        "reclaim_p99_s": {
            "value": fair["reclaim_p99_s"],
            "goal": "< 10",
            "met": fair["reclaim_p99_s"] < GOALS["reclaim_p99_s"],
        },
        "stopped_while_free": {
            "value": fair["stopped_while_free"],
            "goal": "0",
            "met": fair["stopped_while_free"] == 0,
        },
        "wit_p95_ms": {
            "value": fair["wit_p95_ms"],
            "goal": "< 1000 (the planners in process; the API's latency: bench_wit)",
            "met": fair["wit_p95_ms"] is not None and fair["wit_p95_ms"] < 1000,
        },
        "wit_success": {
            "value": fair["wit_success"],
            "goal": ">= 0.95",
            "met": fair["wit_success"] is not None and fair["wit_success"] >= 0.95,
        },
    }
    return report
