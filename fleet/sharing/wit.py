"""What would it take? For a waiting replica, the smallest actions that would place it, ranked
(:func:`fleet.placement.wit.rank_plans`), each with the exact API requests that apply it.

The plans, from the planners Fleet has:

* ``place``: it fits now (``POST /deployments/{id}/place``);
* ``moves``: the fewest moves of other replicas (MIG and MPS: the defrag planner, every smaller
  set searched; whole GPUs: the repack planner, with CP-SAT's proven bound), applied by
  ``POST /deployments/{id}/defrag`` or ``POST /capacity/repack``;
* ``reshape``: one GPU's new MIG layout from the layout advisor (``POST /rollouts/``);
* ``stop``: borrowed replicas of other teams stopped, as a reclaim would
  (:func:`fleet.sharing.reclaim.reclaim_preview`), applied as that reclaim
  (``POST /queue/reclaim/{id}``: planned again when it is sent); only for a replica its
  deserved share still entitles once its team's entitled replicas ahead in the queue have
  theirs (:meth:`Context.entitled_in_turn`);
* ``quota``: the smallest change of its team's quota, when that is what blocks it
  (``PUT /teams/{id}/quota``); when capacity blocks it too, the capacity plans carry the change
  first;
* ``wait``: the earliest time it fits from what the fleet already gives back (replicas
  stopping, the old copies of moves in flight) and layout rollouts that will place it; Fleet
  knows no exit time of a workload, so the time is ``null`` (unknown) unless none is needed.

Answers are per deployment (its waiting replicas ask for the same thing; the plans place its
next one) and cached by the fleet's **fingerprint** (a hash of what the engine places by: the
hosts, GPUs, partitions and allocations, the teams' quotas and the waiting replicas): any
placement change makes a new fingerprint, so an answer for another fleet is never served. Beat
refreshes every waiting deployment's answer (:func:`wit_refresh`); a request that misses the
cache computes its answer at once.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Count, Max, Q
from django.utils import timezone

from fleet.allocations.borrowing import admission, fleet_standing, free_capacity, others_need
from fleet.allocations.holdings import sharing_of, team_usage
from fleet.allocations.models import Allocation, AllocationState, Deployment, RequestKind
from fleet.allocations.planning.advice import capacity_advice
from fleet.allocations.planning.repack_plans import capacity_repack_plan
from fleet.allocations.rankings import placed_demands, placed_requests
from fleet.allocations.reclaims import running_reclaims, serialise_reclaims, within_deserved
from fleet.allocations.selectors import fleet_snapshot, placement_demand, placement_request
from fleet.core.errors import Conflict, NotFound, ServiceError
from fleet.core.jobs import place_queue_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus, Team
from fleet.core.operations import RUNNING
from fleet.inventory.models import Gpu, Host
from fleet.partitioning.models import Partition
from fleet.placement import Target, rank
from fleet.placement.defrag import MovePlan, plan_moves
from fleet.placement.fairshare import QUEUE_FITS_NOW
from fleet.placement.quota import QUOTA_EXCEEDED, Usage, covers, plus, replica_demand
from fleet.placement.sharing import BORROW_UNAVAILABLE, Standing
from fleet.placement.simulate import apply_target
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    PlacementRequest,
    WholeGpuRequest,
)
from fleet.placement.wit import (
    ApiRequest,
    Plan,
    Release,
    fewest_releases,
    quota_change,
    rank_plans,
    with_prefix,
)
from fleet.sharing.placing import MAX_ATTEMPTS, queue_place_unless_busy
from fleet.sharing.queue import QueueEntry, fleet_queue
from fleet.sharing.reclaim import reclaim_preview
from fleet.workflows.defrag import deployment_defrag_apply

logger = logging.getLogger(__name__)

CACHE_PREFIX = "wit:v1"
CACHE_TTL_S = 600
REFRESH_EVERY_S = 60.0
"""The refresh recomputes every answer at least this often, changed fleet or not: time alone
changes some (a borrowed replica passing ``FLEET_RECLAIM_MIN_RUNTIME_S`` may be stopped)."""
MAX_AGE_S = 3 * REFRESH_EVERY_S
"""A request recomputes an answer older than this (the refresh has not come to it)."""
REPACK_TIME_LIMIT_S = 1.0
"""CP-SAT's limit per product for a whole-GPU replica's moves (its bound is proven within it)."""
ADVICE_TIME_LIMIT_S = 2.0
"""The layout advisor's limit per product, in the background refresh."""
ON_DEMAND_ADVICE_TIME_LIMIT_S = 0.3
"""The advisor's limit when a request computes an answer the cache missed."""

MAX_PROMISED = 4
"""Replicas ahead in the queue whose moves plans the walk promises them (each a plan's search)."""

Mover = Callable[[FleetSnapshot, PlacementRequest, Demand], MovePlan]
"""A context's memoised :func:`fleet.placement.defrag.plan_moves`."""

# -- the replica asked about ---------------------------------------------------------------------


@dataclass(frozen=True)
class WaitingRef:
    deployment: Deployment
    replica: int


NEXT = -1
"""The replica number of ``"12.next"``: the deployment's first replica without a place."""


def parse_ref(ref: str) -> tuple[int | None, int | None, int | None]:
    """``"12.3"`` (deployment 12's replica 3), ``"12.next"`` (its first waiting replica:
    :data:`NEXT`) or ``"57"`` (allocation 57): (deployment, replica, allocation); all ``None``
    when it names none of these."""
    text = str(ref).strip()
    if not text.isascii():  # "²" is a digit to str.isdigit, not to int()
        return None, None, None
    if text.isdigit() and len(text) <= 12:
        return None, None, int(text)
    head, dot, tail = text.partition(".")
    if not (dot and head.isdigit() and len(head) <= 12):
        return None, None, None
    if tail == "next":
        return int(head), NEXT, None
    if tail.isdigit() and len(tail) <= 6:
        return int(head), int(tail), None
    return None, None, None


def _not_found(ref: str) -> NotFound:
    return NotFound(
        "replica.not_found",
        f"No replica {ref!r}: name a waiting replica as DEPLOYMENT.REPLICA (the queue's `id`), "
        "or an allocation by its id.",
        {"id": str(ref)[:64]},
    )


def waiting_ref(ref: str) -> WaitingRef:
    """The waiting replica ``ref`` names. Raises 404 ``replica.not_found`` for nothing, 409
    ``wit.placed`` for a replica in place (an allocation, or a replica number that has one)."""
    deployment_id, replica, allocation_id = parse_ref(ref)
    if allocation_id is not None:
        found = Allocation.objects.filter(pk=allocation_id).values_list("deployment_id", "replica")
        row = found.first()
        if row is None:
            raise _not_found(ref)
        raise _placed(ref, row[0], row[1], allocation_id)
    if deployment_id is None or replica is None:
        raise _not_found(ref)
    deployment = (
        Deployment.objects.select_related("team").filter(pk=deployment_id, deleting=False).first()
    )
    if deployment is None or replica >= deployment.replicas:
        raise _not_found(ref)
    if replica == NEXT:
        taken = set(
            Allocation.objects.placed()
            .filter(deployment_id=deployment_id)
            .values_list("replica", flat=True)
        )
        free = [r for r in range(deployment.replicas) if r not in taken]
        if not free:
            raise Conflict(
                "wit.placed",
                f"Every replica of deployment {deployment_id} is placed: nothing needs to happen.",
                {"deployment": deployment_id},
            )
        return WaitingRef(deployment, free[0])
    placed = (
        Allocation.objects.placed()
        .filter(deployment_id=deployment_id, replica=replica)
        .values_list("pk", flat=True)
        .first()
    )
    if placed is not None:
        raise _placed(ref, deployment_id, replica, placed)
    return WaitingRef(deployment, replica)


def _placed(ref: str, deployment_id: int, replica: int, allocation_id: int) -> Conflict:
    return Conflict(
        "wit.placed",
        f"Replica {deployment_id}.{replica} is placed (allocation {allocation_id}): nothing "
        "needs to happen for it to run.",
        {"deployment": deployment_id, "replica": replica, "allocation": allocation_id},
    )


# -- the fingerprint and the cache ---------------------------------------------------------------


def fleet_fingerprint() -> str:
    """A hash of what every answer depends on, read in a few cheap queries (no snapshot): the
    hosts' status, labels, runtimes and reservations; the GPUs' mode, health and cordons; the
    partitions and allocations (how many, the newest, the latest change: a place, an eviction,
    a move, a layout); the teams' quotas and limits; the deployments and their placed replicas;
    the replicas releasing and the rollouts running. What an agent reports every few seconds
    (free CPU and memory) is left out: it would make every answer stale at once."""
    digest = hashlib.blake2b(digest_size=16)
    hosts = Host.objects.order_by("pk").values_list(
        "pk", "status", "labels", "runtime", "process_runtime"
    )
    digest.update(repr(list(hosts)).encode())
    reserved = Host.reserved_for.through.objects.order_by("pk").values_list(
        "pk", "host_id", "team_id"
    )
    digest.update(repr(list(reserved)).encode())
    gpus = Gpu.objects.order_by("pk").values_list("pk", "mode", "health", "cordoned", "product_key")
    digest.update(repr(list(gpus)).encode())
    for model in (Partition, Allocation):
        summary = model.objects.aggregate(n=Count("pk"), last=Max("pk"), changed=Max("updated_at"))
        digest.update(repr(sorted(summary.items())).encode())
    teams = Team.objects.order_by("pk").values_list(
        "pk",
        "quota_gpus",
        "quota_mig_compute_slices",
        "quota_mps_memory_mib",
        "quota_mig_profiles",
        "limit_gpus",
        "limit_mig_compute_slices",
        "limit_mps_memory_mib",
        "limit_mig_profiles",
    )
    digest.update(repr(list(teams)).encode())
    deployments = (
        Deployment.objects.filter(deleting=False)
        .order_by("pk")
        .annotate(
            placed=Count("allocations", filter=~Q(allocations__state=AllocationState.RELEASING))
        )
        .values_list("pk", "replicas", "team_id", "placed", "auto_place", "priority")
    )
    digest.update(repr(list(deployments)).encode())
    releasing = Allocation.objects.releasing().order_by("pk").values_list("pk", flat=True)
    digest.update(repr(list(releasing)).encode())
    rollouts = Operation.objects.filter(
        kind=OperationKind.LAYOUT_ROLLOUT, status__in=RUNNING
    ).values_list("pk", flat=True)
    digest.update(repr(sorted(rollouts)).encode())
    return digest.hexdigest()


def _key(fingerprint: str, deployment_id: int) -> str:
    return f"{CACHE_PREFIX}:{fingerprint}:{deployment_id}"


def cached_answer(fingerprint: str, deployment_id: int) -> dict[str, Any] | None:
    found: dict[str, Any] | None = cache.get(_key(fingerprint, deployment_id))
    return found


# -- the answer ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """The fleet at one point of a queue run: the room left, and where the teams stand."""

    snapshot: FleetSnapshot
    standing: Standing


class QueueWalk:
    """The queue's next run (:func:`fleet.sharing.placing.queue_place_unless_busy`), walked in
    memory once per refresh, as far as the answers ask: the replicas of engine-placed
    deployments in queue order, at most :data:`fleet.sharing.placing.MAX_ATTEMPTS` attempts,
    skipping what the run skips (a request that fit nowhere, a team's demand as large as one
    its sharing refused), each judged by its team's sharing on the standing the ones before it
    leave (a team borrowing before them may not after) and placed on the engine's best
    target. With ``raised``, that team's quota is taken as raised enough for every replica of
    it (what a quota change would let in, those ahead first).

    A replica let in that fits nowhere is promised the room of its own moves plan (``mover``,
    for the first :data:`MAX_PROMISED` of them): the ones behind it are answered on the fleet
    after those moves and its placement, not given the same room (four replicas told to apply
    one defrag for one GPU). The head's moves are the engine's to carry out
    (``FLEET_QUEUE_DEFRAG``), the others' a person's; either way, whoever applies first takes
    that room."""

    def __init__(
        self,
        queue: list[QueueEntry],
        first: dict[int, int],
        start: Served,
        raised: int | None = None,
        mover: Mover | None = None,
        skip: frozenset[int] = frozenset(),
    ) -> None:
        self.queue, self.first = queue, first  # first: each deployment's first position
        self.raised = raised
        self.skip = skip  # positions placed already (by the run before a quota change)
        self.mover = mover
        self.promised = 0  # moves plans promised so far
        self.points: list[tuple[int, Served]] = [(0, start)]  # from entry i on: the fleet
        self.walked = 0
        self.attempts = 0
        self.full: set[str] = set()
        self.first_full: int | None = None  # the first position let in that fit nowhere
        self.refused: dict[int, list[Usage]] = {}

    def before(self, deployment_id: int) -> Served:
        """What the run leaves the deployment's first replica in the queue (the whole run's
        outcome for one the queue does not list)."""
        first = self.first.get(deployment_id, len(self.queue))
        while self.walked < first and self.attempts < MAX_ATTEMPTS:
            if self.walked not in self.skip:
                self._step(self.queue[self.walked])
            self.walked += 1
        return next(served for at, served in reversed(self.points) if at <= first)

    def whole_run(self) -> tuple[Served, frozenset[int]]:
        """The fleet after the whole run, and the positions it placed (or promised moves)."""
        end = self.before(-1)  # no deployment: past the last position
        return end, frozenset(at - 1 for at, _ in self.points[1:])

    def _step(self, entry: QueueEntry) -> None:
        deployment = entry.deployment
        if not deployment.auto_place:
            return
        request, demand = placement_request(deployment), placement_demand(deployment)
        need = replica_demand(request)
        if any(covers(need, r) for r in self.refused.get(deployment.team_id, ())):
            return
        asks = repr((request, demand))
        if asks in self.full:
            return
        self.attempts += 1
        served = self.points[-1][1]
        raised = deployment.team_id == self.raised
        if not raised and not served.standing.verdict(deployment.team_id, need).allowed:
            self.refused.setdefault(deployment.team_id, []).append(need)
            return
        best = None
        if raised or entry.reason.code in (QUEUE_FITS_NOW, BORROW_UNAVAILABLE, QUOTA_EXCEEDED):
            best = rank(served.snapshot, request, demand=demand).best  # else it fit nowhere
        if best is None:
            if self.first_full is None:
                self.first_full = self.walked
            promised = self._promise(served, request, demand)
            if promised is None:
                self.full.add(asks)
                return
            request_snapshot, best = promised
            served = Served(request_snapshot, served.standing)
        after = Served(
            apply_target(served.snapshot, request, best),
            served.standing.after(deployment.team_id, need),
        )
        self.points.append((self.walked + 1, after))

    def _promise(
        self, served: Served, request: PlacementRequest, demand: Demand
    ) -> tuple[FleetSnapshot, Target] | None:
        """The fleet after the replica's moves and where it then goes, while promises are
        left (``None``: no plan, or none is promised)."""
        if self.mover is None or self.promised >= MAX_PROMISED:
            return None
        if isinstance(request, WholeGpuRequest):  # CP-SAT's repack: too slow for a walk
            return None
        plan = self.mover(served.snapshot, request, demand)
        if plan.target is None:
            return None
        self.promised += 1
        return plan.snapshot, plan.target


@dataclass
class Context:
    """What the answers of one refresh share: the snapshot, the moved replicas' requests and
    demands, and the advisor's proposals per product (computed once)."""

    snapshot: FleetSnapshot
    fingerprint: str
    advice_time_limit_s: float
    requests: dict[tuple[str, int], PlacementRequest] | None = None
    demands: dict[tuple[str, int], Demand] | None = None
    advice: dict[str, dict[str, Any] | None] | None = None
    memo: dict[Any, Any] = field(default_factory=dict)
    queue: list[QueueEntry] | None = None
    first_in_queue: dict[int, int] = field(default_factory=dict)  # deployment: its position
    walk: QueueWalk | None = None
    raised_walks: dict[int, QueueWalk] = field(default_factory=dict)  # by the team raised

    def moved_requests(self) -> dict[tuple[str, int], PlacementRequest]:
        if self.requests is None:
            self.requests = placed_requests()
        return self.requests

    def moved_demands(self) -> dict[tuple[str, int], Demand]:
        if self.demands is None:
            self.demands = placed_demands()
        return self.demands

    def served_before(self, deployment_id: int, raised: int | None = None) -> Served:
        """The fleet once the queue's run has placed the waiting replicas ahead of the
        deployment's next one (:class:`QueueWalk`): the room and the standing they leave it.
        Each replica's "it fits now" alone would promise the same slices to all of them. With
        ``raised`` (a team), once a change of that team's quota has let its replicas in: an
        admin's change lands after the queue's next run, which passes over the team's refused
        replicas and places what fits behind them; then its replicas ahead, let in, are placed
        first."""
        if raised is not None:
            if raised not in self.raised_walks:
                self.served_before(deployment_id)  # the walk, shared
                assert self.walk is not None
                end, placed = self.walk.whole_run()
                self.raised_walks[raised] = QueueWalk(
                    self.fleet_queue(), self.first_in_queue, end, raised, self.moves_on, placed
                )
            return self.raised_walks[raised].before(deployment_id)
        if self.walk is None:
            queue = self.fleet_queue()
            start = Served(self.snapshot, fleet_standing())
            self.walk = QueueWalk(queue, self.first_in_queue, start, mover=self.moves_on)
        return self.walk.before(deployment_id)

    def moves_on(
        self, snapshot: FleetSnapshot, request: PlacementRequest, demand: Demand
    ) -> MovePlan:
        """The fewest moves after which the request fits on ``snapshot`` (memoised: deployments
        asking the same on the same fleet get the same plan, and the walk's promise is the
        plan the answer gives)."""
        key = _moves_key(request, demand, snapshot)
        found = self.memo.get(key)
        if found is None or found[0] is not snapshot:
            plan = plan_moves(
                snapshot,
                request,
                demand=demand,
                requests=self.moved_requests(),
                demands=self.moved_demands(),
            )
            found = self.memo[key] = (snapshot, plan)
        return found[1]

    def heads_run(self, deployment_id: int) -> bool:
        """Whether the deployment's next replica heads the queue's run among those that wait
        for capacity: no replica ahead of it, let in by its team's sharing, fit nowhere."""
        self.served_before(deployment_id)
        assert self.walk is not None
        first = self.first_in_queue.get(deployment_id, len(self.fleet_queue()))
        return self.walk.first_full is None or self.walk.first_full >= first

    def after_moves(self, deployment: Deployment) -> Context | None:
        """A context on the fleet once the deployment's moves plan (the one its answer gave,
        on this context's snapshot) is carried out and its replica placed: the answers after
        it are not promised the room it takes. ``None`` when no such plan was made."""
        request, demand = placement_request(deployment), placement_demand(deployment)
        on = self.served_before(deployment.pk).snapshot  # where its answer planned them
        found = self.memo.get(_moves_key(request, demand, on))
        if found is None or found[0] is not on or found[1].target is None:
            return None
        plan = found[1]
        promised = apply_target(plan.snapshot, request, plan.target)
        return Context(promised, self.fingerprint, self.advice_time_limit_s)

    def fleet_queue(self) -> list[QueueEntry]:
        if self.queue is None:
            self.queue = fleet_queue()
            for i, entry in enumerate(self.queue):
                self.first_in_queue.setdefault(entry.deployment.pk, i)
        return self.queue

    def entitled_in_turn(self, deployment: Deployment) -> bool:
        """Whether the deployment's next replica is within its team's deserved share once the
        team's replicas ahead of it in the queue have theirs: each that the share entitles, in
        queue order (the reclaim sweep serves them first, and the queue places them first
        where they fit). A replica entitled alone may be past the share after them: a reclaim
        sent for it then is refused (``reclaim.not_entitled``)."""
        queue = self.fleet_queue()
        first = self.first_in_queue.get(deployment.pk, len(queue))
        team = deployment.team
        sharing = sharing_of(team)
        held = team_usage(team.pk)
        for entry in queue[:first]:
            if entry.team.pk != team.pk:
                continue
            demand = replica_demand(placement_request(entry.deployment))
            if within_deserved(sharing, held, demand):
                held = plus(held, demand)
        return within_deserved(sharing, held, replica_demand(placement_request(deployment)))

    def advice_of(self, product_key: str) -> dict[str, Any] | None:
        if self.advice is None:
            self.advice = {}
        if product_key not in self.advice:
            try:
                found = capacity_advice(product=product_key, time_limit_s=self.advice_time_limit_s)
                self.advice[product_key] = dict(found)
            except ServiceError:
                self.advice[product_key] = None
        return self.advice[product_key]


def new_context(advice_time_limit_s: float = ADVICE_TIME_LIMIT_S) -> Context:
    fingerprint = fleet_fingerprint()  # first: a change while the snapshot is read shows later
    return Context(fleet_snapshot(), fingerprint, advice_time_limit_s)


def _place_request(deployment: Deployment, target: Target, after: str = "") -> ApiRequest:
    """``POST /deployments/{id}/place`` on the engine's target: its free partition, else its GPU
    (a new MIG instance in free space, an MPS share, whole GPUs)."""
    body = (
        {"partition": target.partition_id}
        if target.partition_id is not None and target.new_instance is None
        else {"gpu": target.gpu_id}
    )
    return ApiRequest("POST", f"/deployments/{deployment.pk}/place", body, after=after)


def _then_place(
    deployment: Deployment, target: Target | None, after: str
) -> tuple[ApiRequest, ...]:
    """The request that places it once ``after`` is done (none when the engine does it)."""
    if deployment.auto_place or target is None:
        return ()
    return (_place_request(deployment, target, after),)


def compute_answer(deployment: Deployment, context: Context) -> dict[str, Any]:
    """The ranked plans for the deployment's next waiting replica (user-independent)."""
    started = time.perf_counter()
    snapshot = context.snapshot
    request = placement_request(deployment)
    demand = placement_demand(deployment)
    team = deployment.team
    best = rank(snapshot, request, demand=demand).best
    standing = None
    if best is not None:  # it fits now: unless the queue's replicas ahead take that room first
        served = context.served_before(deployment.pk)
        if served.snapshot is not snapshot:
            snapshot = served.snapshot
            best = rank(snapshot, request, demand=demand).best
        if best is not None and team.shares_bounded:  # and its borrowing, after theirs
            standing = served.standing
    if standing is not None:
        blockers = list(standing.verdict(team.pk, replica_demand(request)).violations)
    else:
        blockers = _quota_blockers(team, request)
    if blockers and best is not None:
        # A quota change lets its team's replicas ahead of it in too, and the queue places
        # them first: it is promised the room they leave, and the change covers them all.
        served = context.served_before(deployment.pk, raised=team.pk)
        if served.snapshot is not snapshot:
            snapshot = served.snapshot
            best = rank(snapshot, request, demand=demand).best
        if team.shares_bounded:
            standing = served.standing
    fits = best is not None
    plans: list[Plan] = []
    if best is not None:
        plans.append(_place_plan(deployment, best))
    else:  # moves on what the replicas ahead leave, their own moves' room included
        ahead = context.served_before(deployment.pk, raised=team.pk if blockers else None)
        plans += _moves_plans(deployment, request, demand, context, ahead.snapshot)
        plans += _reshape_plans(deployment, request, context)
        if not blockers and context.entitled_in_turn(deployment):
            plans += _stop_plans(deployment)
    if blockers:
        plans = _with_quota(deployment, request, plans, best, standing)
    plans.append(_wait_plan(deployment, request, demand, snapshot, blockers, fits))
    ranked = rank_plans(plans)
    return {
        "deployment": deployment.pk,
        "deployment_name": deployment.name,
        "team": team.pk,
        "team_name": team.name,
        "blocked_by": "none" if fits and not blockers else ("quota" if blockers else "capacity"),
        "quota_reasons": [v.as_dict() for v in blockers],
        "fingerprint": context.fingerprint,
        "computed_at": timezone.now().isoformat(),
        "computed_s": time.time(),
        "compute_ms": round((time.perf_counter() - started) * 1000, 1),
        "plans": [_plan_body(p, n) for n, p in enumerate(ranked, start=1)],
    }


def _plan_body(plan: Plan, position: int) -> dict[str, Any]:
    return {
        "rank": position,
        "kind": plan.kind,
        "summary": plan.summary,
        "requests": [r.as_dict() for r in plan.requests],
        "moved": plan.moved,
        "stopped": plan.stopped,
        "reshaped": plan.reshaped,
        "changes_policy": plan.changes_policy,
        "destructive": plan.destructive,
        "role": plan.role,
        "proof": dict(plan.proof),
        "details": dict(plan.details),
    }


def _quota_blockers(team: Team, request: PlacementRequest) -> list[Any]:
    if not team.shares_bounded:
        return []
    verdict = admission(team, team_usage(team.pk), replica_demand(request))
    return list(verdict.violations)


def _place_plan(deployment: Deployment, target: Target) -> Plan:
    how = "the engine places it" if deployment.auto_place else "place it"
    return Plan(
        "place",
        f"It fits now: {how}.",
        (_place_request(deployment, target),),
        role="team_operator",
    )


def _moves_key(request: PlacementRequest, demand: Demand, snapshot: FleetSnapshot) -> Any:
    """Where a context memoises the moves plan for a request on a snapshot."""
    return ("moves", request, demand, id(snapshot))


def _moves_plans(
    deployment: Deployment,
    request: PlacementRequest,
    demand: Demand,
    context: Context,
    snapshot: FleetSnapshot,
) -> list[Plan]:
    """On ``snapshot``: the fleet's, or what the queue's replicas ahead leave."""
    if isinstance(request, WholeGpuRequest):
        return _repack_plans(deployment, request, demand, context)
    plan = context.moves_on(snapshot, request, demand)
    if plan.target is None:
        return []
    workloads = sum(1 for m in plan.moves if m.occupied)
    idle = len(plan.moves) - workloads
    size = len(plan.moves)
    return [
        Plan(
            "moves",
            f"Move {workloads} replica{'s' * (workloads != 1)} (make before break)"
            + (f" and destroy {idle} idle slice{'s' * (idle != 1)}" if idle else "")
            + ", then place it.",
            (ApiRequest("POST", f"/deployments/{deployment.pk}/defrag", None),),
            moved=workloads,
            destructive=True,
            role="operator",
            proof={
                "bound": size,
                "method": "exhaustive",
                "status": "optimal",
                "claim": f"No set of fewer than {size} replicas and idle slices on one GPU, "
                "moved elsewhere, makes room for it: every smaller set of every GPU it could "
                "use was tried.",
            },
            details={
                "target_gpu": plan.target.gpu_id,
                "moves": [
                    {
                        "kind": m.kind,
                        "allocation": m.allocation_id,
                        "from_gpu": m.from_gpu,
                        "to_gpu": m.to_gpu,
                        "occupied": m.occupied,
                    }
                    for m in plan.moves
                ],
            },
        )
    ]


def _repack_plans(
    deployment: Deployment, request: WholeGpuRequest, demand: Demand, context: Context
) -> list[Plan]:
    products = sorted({g.product_key for g in context.snapshot.gpus if g.product_key})
    if demand.products:
        products = [p for p in products if p in demand.products]
    best, target = None, None
    for key in products:
        memo = ("repack", key, request.count)
        if memo not in context.memo:  # the same for every deployment: computed once
            context.memo[memo] = capacity_repack_plan(
                product_key=key, count=request.count, time_limit_s=REPACK_TIME_LIMIT_S
            )
        plan = context.memo[memo]
        after = rank(plan.snapshot, request, demand=demand).best if plan.feasible else None
        if after is None:
            continue
        if best is None or plan.cost < best.cost:
            best, target = plan, after
    if best is None:
        return []
    n = best.cost
    requests = (
        ApiRequest(
            "POST",
            "/capacity/repack",
            {"product": best.product_key, "free_gpus": request.count, "max_unavailable": 1},
        ),
        *_then_place(deployment, target, after="operation"),
    )
    return [
        Plan(
            "moves",
            f"Move {n} replica{'s' * (n != 1)} (make before break) to empty "
            f"{request.count} {best.product_key} GPU{'s' * (request.count != 1)}, then place it.",
            requests,
            moved=n,
            destructive=True,
            role="operator",
            proof={
                "bound": best.bound,
                "method": best.method,
                "status": best.status,
                "claim": f"No plan emptying {request.count} GPU{'s' * (request.count != 1)} of "
                f"{best.product_key} moves fewer than {best.bound} replicas"
                + (" (proven optimal)." if best.bound == n else f"; this one moves {n}."),
            },
            details={"freed_gpus": list(best.freed), "product": best.product_key},
        )
    ]


def _reshape_plans(
    deployment: Deployment, request: PlacementRequest, context: Context
) -> list[Plan]:
    if isinstance(request, WholeGpuRequest):
        return []
    products = sorted(
        {g.product_key for g in context.snapshot.gpus if g.mode == "mig" and g.product_key}
    )
    found: list[Plan] = []
    for key in products:
        advice = context.advice_of(key)
        if not advice:
            continue
        plan = _one_reshape(deployment, advice)
        if plan is not None:
            found.append(plan)
    return sorted(found, key=lambda p: p.cost)[:1]


def _one_reshape(deployment: Deployment, advice: dict[str, Any]) -> Plan | None:
    """The advisor's layout of one GPU that serves the deployment, not drained (it moves
    nobody) first; else the whole rollout when it places the deployment."""
    serving = [
        g
        for g in advice.get("gpus", [])
        if any(p["serves"] == deployment.name for p in g.get("places", []))
    ]
    solver = advice.get("solver", {})
    proof = {
        "bound": solver.get("bound"),
        "method": "cp-sat" if solver.get("status") != "heuristic" else "greedy",
        "status": solver.get("status"),
        "claim": "The layout advisor's proposal: the most waiting replicas placed, then the "
        "fewest running ones moved (its objective and proven bound).",
    }
    quiet = sorted((g for g in serving if not g["drained"]), key=lambda g: g["moved_replicas"])
    if quiet:
        g = quiet[0]
        body = {
            "selector": {"gpus": [g["gpu"]]},
            "layouts": [{"gpu": g["gpu"], "layout": g["layout"]}],
            "max_unavailable": 1,
            "place_waiting": [deployment.pk],
        }
        return Plan(
            "reshape",
            f"Reshape {g['name']} (idle slices only: nobody moves), then place it.",
            (ApiRequest("POST", "/rollouts/", body),),
            reshaped=1,
            destructive=True,
            role="operator",
            proof=proof,
            details={"gpus": [g["gpu"]], "product": advice.get("product_key")},
        )
    rollout = advice.get("rollout")
    if not serving or not rollout or deployment.pk not in rollout.get("place_waiting", []):
        return None
    moved = int(advice.get("moved_replicas", 0))
    gpus = [g["gpu"] for g in advice.get("gpus", [])]
    return Plan(
        "reshape",
        f"Reshape {len(gpus)} GPU{'s' * (len(gpus) != 1)} (the advisor's rollout, moving "
        f"{moved} replica{'s' * (moved != 1)}), then place it.",
        (ApiRequest("POST", "/rollouts/", rollout),),
        moved=moved,
        reshaped=len(gpus),
        destructive=True,
        role="operator",
        proof=proof,
        details={"gpus": gpus, "product": advice.get("product_key")},
    )


def _stop_plans(deployment: Deployment) -> list[Plan]:
    """Stopping borrowed replicas as a reclaim would (its claimant entitled, the moves it also
    needs first): applied as that reclaim, ``POST /queue/reclaim/{id}``, which plans again when
    it is sent, as ``defrag`` does for moves: what it stops is the fleet's then, not a list of
    evictions that another reclaim, a departure or a move may have made wrong meanwhile."""
    preview = reclaim_preview(deployment.pk)
    plan = preview.plan
    if plan.action != "stop":
        return []
    stopped = [preview.allocations[b.key] for b in plan.stops]
    moved = sum(1 for m in plan.moves if m.occupied)
    n = len(stopped)
    first = f"move {moved} replica{'s' * (moved != 1)} (make before break), then " if moved else ""
    return [
        Plan(
            "stop",
            f"Reclaim: {first}stop {n} borrowed replica{'s' * (n != 1)} of other teams (they "
            "wait again), then place it.",
            (ApiRequest("POST", f"/queue/reclaim/{deployment.pk}", None),),
            moved=moved,
            stopped=n,
            destructive=True,
            role="operator",
            proof={
                "bound": n,
                "method": "reclaim",
                "status": "optimal",
                "claim": "The reclaim plan: nothing fits and no moves alone make room; these "
                "are the fewest stops on one host, lowest priority and most recently started "
                "first.",
            },
            details={
                "stops": [
                    {
                        "allocation": a.pk,
                        "deployment": a.deployment_id,
                        "replica": a.replica,
                        "gpu": a.gpu_id,
                    }
                    for a in stopped
                ],
                "planned_again": True,
            },
        )
    ]


def _with_quota(
    deployment: Deployment,
    request: PlacementRequest,
    plans: list[Plan],
    best: Target | None,
    standing: Standing | None = None,
) -> list[Plan]:
    """Its team's quota blocks it: the quota change alone when it then fits, and before every
    capacity plan otherwise (a capacity plan alone would not place it). ``standing``: where
    the teams stand once the queue's replicas ahead are placed (else as they stand now)."""
    team = deployment.team
    demand = replica_demand(request)
    if standing is not None:
        held, free, needed = standing.held[team.pk], standing.free, standing.others_need(team.pk)
    else:
        held, free, needed = team_usage(team.pk), free_capacity(), others_need(team.pk)
    change = quota_change(sharing_of(team), held, demand, free, needed)
    if change is None:
        return []
    put = ApiRequest("PUT", f"/teams/{team.pk}/quota", change.body)
    raised = ", ".join(f"{where} {kind} {old} → {new}" for where, kind, old, new in change.raised)
    if best is not None:
        # An engine-placed deployment needs no place request: the change runs the queue, and
        # the reclaim sweep where it now entitles the replica (room taken meanwhile is
        # reclaimed for it), where an explicit target could have been taken already.
        then = "the engine places it" if deployment.auto_place else "place it"
        return [
            Plan(
                "quota",
                f"Raise team {team.name}'s quota ({raised}), then {then}.",
                (put, *_then_place(deployment, best, after="")),
                changes_policy=True,
                role="admin",
                details={"raised": [list(r) for r in change.raised], "borrowed": change.borrowed},
            )
        ]
    note = f"Raise team {team.name}'s quota ({raised});"
    return [with_prefix(p, (put,), "admin", note) for p in plans if p.kind != "place"]


def _releases(snapshot: FleetSnapshot) -> list[Release]:
    """What the fleet gives back already: replicas releasing, and the old copies of moves in
    flight (released once the new copy runs). No exit time is known: ``by_s`` is ``None``."""
    old_copies = Allocation.objects.placed().filter(successor__isnull=False)
    rows = list(Allocation.objects.releasing()) + list(old_copies)
    found = []
    for a in rows:
        if a.kind == RequestKind.GPU:
            key = ("gpu", a.gpu_id)
        else:
            key = ("mig" if a.kind == RequestKind.MIG else "mps", a.pk)
        what = "stopping" if a.state == AllocationState.RELEASING else "moving"
        found.append(Release(key, a.gpu_id, None, f"{a.deployment_id}.{a.replica} {what}"))
    return found


def _wait_plan(
    deployment: Deployment,
    request: PlacementRequest,
    demand: Demand,
    snapshot: FleetSnapshot,
    blockers: list[Any],
    fits: bool,
) -> Plan:
    """When it fits with nobody acting, as far as Fleet knows."""
    if fits and not blockers:
        return _wait("now", timezone.now().isoformat(), "It fits now.")
    if blockers:
        return _wait(
            "unknown",
            None,
            "Its team's quota blocks it: it fits when the team's own replicas end, which Fleet "
            "cannot foresee.",
        )
    rollouts = Operation.objects.filter(
        kind=OperationKind.LAYOUT_ROLLOUT, status__in=RUNNING
    ).order_by("pk")
    for op in rollouts:
        if deployment.pk in (op.payload or {}).get("place_waiting", []):
            return _wait(
                "rollout",
                None,
                f"Layout rollout {op.pk} places it when it ends (its end time is unknown).",
                operation=op.pk,
            )
    releases = _releases(snapshot)
    needed = fewest_releases(
        releases, lambda s: rank(s, request, demand=demand).best is not None, snapshot
    )
    if needed is not None:
        n = len(needed)
        return _wait(
            "releases",
            None,
            f"It fits once {n} replica{'s' * (n != 1)} now stopping or moving "
            f"{'have' if n != 1 else 'has'} given back {'their' if n != 1 else 'its'} slice "
            "(when their workloads exit: the time is unknown).",
            releases=[r.what for r in needed],
        )
    return _wait(
        "unknown",
        None,
        "Nothing scheduled frees room for it: no replica is stopping or moving out of its way "
        "and no rollout will place it. Scheduled drains only take capacity away.",
    )


def _wait(when: str, at: str | None, summary: str, **details: Any) -> Plan:
    return Plan("wait", summary, details={"when": when, "at": at, **details})


# -- reading and refreshing ----------------------------------------------------------------------


def answer_for(ref: str) -> tuple[WaitingRef, dict[str, Any], bool]:
    """The answer for the waiting replica ``ref`` names: cached when the fleet has not changed
    since it was computed, less than :data:`REFRESH_EVERY_S` ago (``True``), else computed now
    and cached."""
    waiting = waiting_ref(ref)
    fingerprint = fleet_fingerprint()
    found = cached_answer(fingerprint, waiting.deployment.pk)
    if found is not None and time.time() - found.get("computed_s", 0) < MAX_AGE_S:
        return waiting, found, True
    context = Context(fleet_snapshot(), fingerprint, ON_DEMAND_ADVICE_TIME_LIMIT_S)
    answer = compute_answer(waiting.deployment, context)
    cache.set(_key(fingerprint, waiting.deployment.pk), answer, CACHE_TTL_S)
    _kick_if_it_fits(waiting.deployment, answer)
    return waiting, answer, False


def placing_now(deployment: Deployment) -> dict[str, Any] | None:
    """The defrag or reclaim running now that places the deployment's next replica, if any
    (not cached: it starts and ends without the fleet's fingerprint changing)."""
    running = (
        Operation.objects.filter(
            deployment=deployment,
            kind__in=(OperationKind.DEFRAG, OperationKind.RECLAIM),
            status__in=RUNNING,
        )
        .order_by("-pk")
        .first()
    )
    if running is None:
        return None
    return {
        "operation": running.pk,
        "kind": running.kind,
        "requested_by": running.requested_by_name or None,
    }


def _fits_now(deployment: Deployment, answer: dict[str, Any]) -> bool:
    """Whether the answer says the engine places the replica now: its team's quota allows it
    and it fits once the queue's replicas ahead have theirs."""
    return bool(deployment.auto_place and answer["blocked_by"] == "none")


def _kick_if_it_fits(deployment: Deployment, answer: dict[str, Any]) -> None:
    """A replica that fits now, its team's quota allowing, is the engine's to place: the queue
    runs at once (:func:`fleet.core.jobs.place_queue_after_commit`, once a second at most)
    rather than at beat's next run, so the answer's ``place`` plan is seldom left to a person
    (and to a race with the replicas arriving meanwhile)."""
    if _fits_now(deployment, answer):
        place_queue_after_commit()


def _place_at_once() -> bool:
    """The queue places now, on this worker (a refresh's first replica that fits): not held
    back by the kicks' once-a-second hold, in which an arrival or a reclaim could take the
    room the answer names. Where another worker's run holds the queue, a kick follows it.
    Whether it placed anything (the fleet the refresh answers on has changed)."""
    try:
        placed = queue_place_unless_busy()
    except Exception:  # the refresh goes on; the kick runs the queue on a worker
        logger.exception("what-would-it-take could not run the queue")
        placed = None
    if placed is None:
        place_queue_after_commit()
    return bool(placed)


def _defrag_for_head(deployment: Deployment, answer: dict[str, Any], context: Context) -> bool:
    """``FLEET_QUEUE_DEFRAG``: the engine carries out the answer's top plan when it is the
    fewest moves of other replicas (``POST .../defrag``; make before break: nobody loses a
    running replica) for an engine-placed replica that its team's quota lets in and that heads
    the queue's run among those waiting for capacity. One such defrag at a time, fleet-wide (none
    while any defrag runs), none on a GPU a running reclaim touches, and none for a deployment
    whose last one failed less than ``FLEET_RECLAIM_RETRY_S`` ago. Whether it started one
    (:func:`fleet.workflows.defrag.deployment_defrag_apply`, which plans again on the fleet as
    it is)."""
    if not (settings.FLEET_QUEUE_DEFRAG and deployment.auto_place):
        return False
    if answer["blocked_by"] != "capacity" or not answer["plans"]:
        return False
    top = answer["plans"][0]
    if (
        top["kind"] != "moves"
        or top["requests"][0]["path"] != f"/deployments/{deployment.pk}/defrag"
    ):
        return False
    if not context.heads_run(deployment.pk):
        return False
    if _defrag_running():
        return False  # checked again under the lock; not worth waiting for it meanwhile
    with transaction.atomic():
        serialise_reclaims()  # two refreshes, or a reclaim sweep, see each other's starts
        started = _defrag_start(deployment, top["details"])
    if started is None:
        return False
    logger.info("defragmenting for the queue's head %s (operation %s)", deployment.pk, started.pk)
    return True


def _defrag_running() -> bool:
    return Operation.objects.filter(kind=OperationKind.DEFRAG, status__in=RUNNING).exists()


def _defrag_start(deployment: Deployment, details: dict[str, Any]) -> Operation | None:
    """:func:`_defrag_for_head`'s start, unless a defrag runs, the deployment's last one
    failed lately, or a running reclaim touches the plan's GPUs."""
    if _defrag_running():
        return None
    since = timezone.now() - timedelta(seconds=float(settings.FLEET_RECLAIM_RETRY_S))
    failed = (OperationStatus.FAILED, OperationStatus.EXPIRED)
    defrags = Operation.objects.filter(kind=OperationKind.DEFRAG)
    if defrags.filter(deployment=deployment, status__in=failed, finished_at__gte=since).exists():
        return None  # its last one failed (a move that would not start, say): not again yet
    gpus = {details["target_gpu"]}
    for move in details["moves"]:
        gpus |= {move["from_gpu"], move["to_gpu"]} - {None}
    if gpus & running_reclaims()[1]:
        return None
    try:
        with transaction.atomic():
            return deployment_defrag_apply(deployment_id=deployment.pk)
    except ServiceError as error:  # fits now, no plan any more, one running: not this time
        logger.info("the queue's head %s was not defragmented: %s", deployment.pk, error.code)
        return None


def waiting_deployments() -> list[Deployment]:
    """Every live deployment with a replica not in place."""
    rows = (
        Deployment.objects.filter(deleting=False)
        .select_related("team")
        .annotate(
            placed=Count(
                "allocations__replica",
                filter=~Q(allocations__state=AllocationState.RELEASING),
                distinct=True,
            )
        )
        .order_by("pk")
    )
    return [d for d in rows if d.placed < d.replicas]


@dataclass(frozen=True)
class Refresh:
    fingerprint: str
    computed: int
    skipped: bool
    seconds: float


def wit_refresh(deployments: Iterable[Deployment] | None = None) -> Refresh:
    """Beat: compute and cache the answer of every waiting deployment, unless the fleet has not
    changed since the last refresh less than :data:`REFRESH_EVERY_S` ago; an answer computed
    (on demand) for this fleet within that time is kept.

    The first replica found fitting now has the queue run at once, on this worker
    (:func:`_place_at_once`); the others kick it as an on-demand answer does (held to once a
    second). Where that run placed replicas, the answers after it are computed on the fleet
    as it is now (a new context), and the fleet is not marked done (the answers before it
    were on the fleet before). The head of the queue's moves plan is carried out
    (:func:`_defrag_for_head`); the answers after it are computed on the fleet those moves and
    its placement leave (the room they take is not promised to another), and the fleet is not
    marked done. A run stops once it took ``FLEET_WIT_REFRESH_BUDGET_S`` (a
    worker is not held for minutes by a large fleet), without marking the fleet done: the next
    run goes on, the deployments answered longest ago (or never) first, so none starves while
    the fleet keeps changing."""
    started = time.perf_counter()
    budget = float(settings.FLEET_WIT_REFRESH_BUDGET_S)
    advice_s = float(settings.FLEET_WIT_ADVICE_SECONDS)
    context = new_context(advice_s)
    done = f"{CACHE_PREFIX}:done:{context.fingerprint}"
    if deployments is None and cache.get(done):
        return Refresh(context.fingerprint, 0, True, time.perf_counter() - started)
    todo = list(deployments if deployments is not None else waiting_deployments())
    last = cache.get_many([f"{CACHE_PREFIX}:last:{d.pk}" for d in todo])
    todo.sort(key=lambda d: (last.get(f"{CACHE_PREFIX}:last:{d.pk}", 0.0), d.pk))
    computed = 0
    finished = True
    placed_at_once = False  # the first replica found fitting: the queue runs here, at once
    defragged = False  # the head of the queue's moves, carried out
    for deployment in todo:
        key = _key(context.fingerprint, deployment.pk)
        found = cache.get(key)
        if found is not None and time.time() - found.get("computed_s", 0) < REFRESH_EVERY_S:
            # Answered for this fleet already (on demand, say): its moves may still be the
            # head's to carry out.
            if not defragged and _defrag_for_head(deployment, found, context):
                defragged, finished = True, False
                context = new_context(advice_s)
            continue
        if computed and time.perf_counter() - started > budget:
            finished = False
            break
        try:
            answer = compute_answer(deployment, context)
            cache.set(key, answer, CACHE_TTL_S)
            cache.set(f"{CACHE_PREFIX}:last:{deployment.pk}", time.time(), CACHE_TTL_S)
            if not placed_at_once and _fits_now(deployment, answer):
                placed_at_once = True
                if _place_at_once():  # the fleet changed: answer the rest on it as it is
                    context, finished = new_context(advice_s), False
            elif not defragged and _defrag_for_head(deployment, answer, context):
                defragged, finished = True, False
                context = context.after_moves(deployment) or new_context(advice_s)
            else:
                _kick_if_it_fits(deployment, answer)
            computed += 1
        except Exception:  # one deployment's failure must not stop the others' answers
            logger.exception("what-would-it-take failed for deployment %s", deployment.pk)
    if finished:
        cache.set(done, True, REFRESH_EVERY_S)
    return Refresh(context.fingerprint, computed, False, time.perf_counter() - started)
