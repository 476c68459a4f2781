"""Repack: the moves that empty ``count`` whole GPUs of one product, moving the fewest replicas.

An exact model solved by OR-Tools CP-SAT (imported lazily; a time limit bounds it), with the
greedy :func:`fleet.placement.defrag.plan_free_gpus` as the fallback when ortools is missing, the
model is too big, or the solver finds no plan in time. The model:

* ``empty[s]``: GPU ``s`` of the product is emptied; exactly ``count`` are. A GPU is a candidate
  when it holds something and every replica on it can move (a multi-GPU replica, or MPS clients
  inside a MIG instance, pin it: it is listed in ``unmovable`` with the reason).
* ``move[r, g]``: replica ``r`` of an emptied GPU lands on GPU ``g``; exactly one ``g`` when its
  GPU is emptied, none otherwise, and never a GPU being emptied. A pair exists only when
  :func:`fleet.placement.check` accepts ``r`` on ``g`` as it is now (health, cordons, host
  runtime and labels, the replica's products, MIG placements, MPS caps), so each rule of one
  replica on one GPU is the engine's own.
* What several arrivals share on one GPU: an MPS daemon's free memory and client slots (the
  compute cap is per client, never summed: ECS); a free dedicated GPU takes one whole-GPU
  replica; a MIG GPU takes one of the maximal multisets of arriving profiles that fit beside
  what stays (idle instances of a profile reused first, new ones by
  :func:`fleet.mig.suggest_layout`).
* Cost: the replicas moved (idle MIG instances on an emptied GPU are destroyed for free).

An idle GPU (nothing placed, whatever its mode and idle MIG instances) of the product is already
free: it is not emptied and never receives a replica (that would undo a GPU freed); idle GPUs of
other products may receive. MPS clients go only to whole-GPU MPS daemons in this model. Every
plan, from either method, is replayed move by move with :func:`fleet.placement.check` on the
snapshot before it is returned, with the MIG starts it names, so an applied plan keeps every
rule.
``bound`` is a proven lower bound on the cost: with CP-SAT, the solver's bound over its model
(which lands MPS clients on whole-GPU daemons only) and never below the sum of the ``count``
cheapest candidates, the bound reported with the greedy plan (valid for any plan). When the
greedy plan moves fewer replicas than CP-SAT found in time, the greedy plan is returned, so a
plan is never worse than the greedy one. On a large fleet the model holds only the
``count + MODEL_SLACK`` cheapest candidates (then the bound is the cheap one).
"""

from __future__ import annotations

import importlib
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, Literal

from fleet.domain import Violation
from fleet.mig import Instance, Product, suggest_layout
from fleet.mps import MpsRequest
from fleet.placement import migfit
from fleet.placement.defrag import Move, plan_free_gpus
from fleet.placement.fit import check
from fleet.placement.ranking import Target
from fleet.placement.rules import share_state
from fleet.placement.simulate import apply_target
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    MigRequest,
    PlacementRequest,
    WholeGpuRequest,
)

Method = Literal["cp-sat", "greedy"]
ReplicaKey = tuple[str, int]
"""``(Move.kind, Move.allocation_id)``."""

DEFAULT_TIME_LIMIT_S = 3.0
MAX_PAIRS = 50_000
"""Replica-to-GPU pairs above which the model is not built (the greedy plan answers)."""
SOLVER_WORKERS = 2
MODEL_SLACK = 24
"""The model holds the ``count + MODEL_SLACK`` cheapest candidates (an optimum empties cheap
GPUs); with fewer left out, the solver's bound is proven for the whole fleet."""
_SOLVER_STATUSES = frozenset({"optimal", "feasible", "infeasible", "unknown"})

__all__ = ["DEFAULT_TIME_LIMIT_S", "MAX_PAIRS", "Method", "RepackPlan", "plan_repack"]


@dataclass(frozen=True)
class RepackPlan:
    """A repack proposal.

    Attributes:
        product_key: the product whose GPUs are emptied.
        asked: how many GPUs were asked for.
        feasible: whether ``asked`` GPUs can be emptied (``reason`` says why not).
        moves: in order, make before break, grouped by the GPU they empty.
        freed: the GPUs the moves empty.
        cost: replicas moved.
        bound: no plan emptying ``asked`` GPUs moves fewer replicas (proven; 0 when infeasible).
        method: ``cp-sat`` or ``greedy``.
        status: the solver's status (``optimal``, ``feasible``, ``infeasible``, ``unknown``) or
            why it did not run (``not_installed``, ``too_big``, ``no_candidates``).
        reason: why the plan is infeasible, or why the greedy plan was used; empty otherwise.
        unmovable: GPUs of the product that hold something and cannot be emptied, with why.
        already_free: GPUs of the product holding nothing now.
        snapshot: the fleet after the moves.
    """

    product_key: str
    asked: int
    feasible: bool
    moves: tuple[Move, ...]
    freed: tuple[int, ...]
    cost: int
    bound: int
    method: Method
    status: str
    reason: str
    unmovable: tuple[tuple[int, str], ...]
    already_free: int
    snapshot: FleetSnapshot


@dataclass(frozen=True)
class _Replica:
    key: ReplicaKey
    gpu_id: int
    request: PlacementRequest
    demand: Demand | None
    occupied: bool = True


def load_cp_model() -> ModuleType | None:
    """``ortools.sat.python.cp_model``, or ``None`` when OR-Tools is not installed."""
    try:
        return importlib.import_module("ortools.sat.python.cp_model")
    except ImportError:
        return None


def plan_repack(
    snapshot: FleetSnapshot,
    product_key: str,
    count: int,
    *,
    demands: Mapping[ReplicaKey, Demand] | None = None,
    requests: Mapping[ReplicaKey, PlacementRequest] | None = None,
    pinned: Mapping[int, str] | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    max_pairs: int = MAX_PAIRS,
    use_solver: bool = True,
) -> RepackPlan:
    """Moves that empty ``count`` GPUs of ``product_key`` holding something, fewest replicas
    moved.

    Args:
        snapshot: the fleet.
        product_key: the product (``GpuState.product_key``).
        count: GPUs to empty.
        demands: what each replica needs beside its share, by ``(kind, allocation_id)``.
        requests: each replica's request as its deployment declares it (a MIG profile by name:
            the same id names another profile on another product); default: what it holds.
        pinned: GPUs that must stay as they are, with why (a replica spanning several GPUs, a
            move in progress): never emptied, listed in ``unmovable``.
        time_limit_s: CP-SAT's wall-clock limit.
        max_pairs: above this many replica-to-GPU pairs the greedy plan answers.
        use_solver: ``False`` asks for the greedy plan.

    Returns:
        The plan; ``feasible`` is false (no moves) when ``count`` GPUs cannot be emptied.
    """
    problem = _Problem(snapshot, product_key, demands or {}, requests or {}, pinned or {})
    greedy = problem.greedy(count)
    if len(problem.candidates) < count:
        return problem.infeasible(count, "no_candidates", greedy)
    cp_model = load_cp_model() if use_solver else None
    if cp_model is None:
        status = "not_installed" if use_solver else "not_asked"
        return problem.fallback(count, greedy, status, "OR-Tools is not installed")
    problem.restrict(count + MODEL_SLACK)
    pairs = problem.pairs()
    if sum(len(targets) for targets in pairs.values()) > max_pairs:
        return problem.fallback(count, greedy, "too_big", f"more than {max_pairs} pairs")
    solved = _solve(cp_model, problem, pairs, count, greedy, time_limit_s)
    return problem.decide(count, greedy, solved)


@dataclass(frozen=True)
class _Solved:
    status: str
    emptied: tuple[int, ...]
    landing: dict[ReplicaKey, int]
    bound: int


class _Problem:
    """The candidates, their replicas and what the greedy plan does, for one product."""

    def __init__(
        self,
        snapshot: FleetSnapshot,
        product_key: str,
        demands: Mapping[ReplicaKey, Demand],
        requests: Mapping[ReplicaKey, PlacementRequest],
        pinned: Mapping[int, str],
    ) -> None:
        self.snapshot = snapshot
        self.product_key = product_key
        self.demands = demands
        self.requests = requests
        mine = [g for g in snapshot.gpus if g.product_key == product_key]
        self.idle = {g.id for g in mine if _idle(g)}
        self.replicas: dict[int, list[_Replica]] = {}
        unmovable: list[tuple[int, str]] = []
        for gpu in mine:
            if gpu.id in self.idle:
                continue
            why = pinned.get(gpu.id) or _pinned(gpu)
            if why:
                unmovable.append((gpu.id, why))
            else:
                self.replicas[gpu.id] = _replicas_of(gpu, demands, requests)
        self.unmovable = tuple(unmovable)
        self.candidates = list(self.replicas)
        self.modelled = self.candidates

    def restrict(self, limit: int) -> None:
        """Model only the ``limit`` cheapest candidates (the others stay as they are)."""
        cheapest = set(sorted(self.candidates, key=self.occupied)[:limit])
        self.modelled = [g for g in self.candidates if g in cheapest]

    @property
    def restricted(self) -> bool:
        return len(self.modelled) < len(self.candidates)

    def occupied(self, gpu_id: int) -> int:
        return sum(1 for r in self.replicas[gpu_id] if r.occupied)

    def cheap_bound(self, count: int) -> int:
        return sum(sorted(self.occupied(g) for g in self.candidates)[:count])

    def pairs(self) -> dict[ReplicaKey, list[int]]:
        """Where each replica of a candidate could land, alone, as the fleet is now."""
        targets = [g for g in self.snapshot.gpus if g.id not in self.idle]
        verdicts: dict[tuple[Any, ...], dict[int, bool]] = defaultdict(dict)
        found: dict[ReplicaKey, list[int]] = {}
        for gpu_id in self.modelled:
            for replica in self.replicas[gpu_id]:
                if not replica.occupied:
                    continue
                seen = verdicts[(replica.request, replica.demand)]
                found[replica.key] = [
                    t.id for t in targets if t.id != gpu_id and self._lands(replica, t, seen)
                ]
        return found

    def _lands(self, replica: _Replica, target: GpuState, seen: dict[int, bool]) -> bool:
        if target.id not in seen:
            if isinstance(replica.request, MpsRequest) and target.mode != "mps":
                seen[target.id] = False
            else:
                verdict = check(
                    self.snapshot,
                    replica.request,
                    gpu_id=target.id,
                    strategy="first_fit",
                    demand=replica.demand,
                )
                seen[target.id] = isinstance(verdict, Target)
        return seen[target.id]

    def greedy(self, count: int) -> tuple[tuple[Move, ...], tuple[int, ...], FleetSnapshot]:
        # The idle GPUs of the product are shown cordoned, so that nothing lands there.
        masked = replace(
            self.snapshot,
            gpus=tuple(
                replace(g, cordoned=True) if g.id in self.idle else g for g in self.snapshot.gpus
            ),
        )
        plan = plan_free_gpus(
            masked,
            count,
            sources=[g for g in self.candidates if not self._has_whole(g)],
            demands=self.demands,
            requests=self.requests,
        )
        cordoned = {g.id: g.cordoned for g in self.snapshot.gpus}
        after = replace(
            plan.snapshot,
            gpus=tuple(replace(g, cordoned=cordoned[g.id]) for g in plan.snapshot.gpus),
        )
        return plan.moves, plan.freed, after

    def _has_whole(self, gpu_id: int) -> bool:
        return any(r.key[0] == "gpu" for r in self.replicas[gpu_id])

    def plan(self, count: int, **fields: Any) -> RepackPlan:
        defaults: dict[str, Any] = {
            "product_key": self.product_key,
            "asked": count,
            "feasible": False,
            "moves": (),
            "freed": (),
            "cost": 0,
            "bound": self.cheap_bound(count),
            "method": "greedy",
            "status": "unknown",
            "reason": "",
            "unmovable": self.unmovable,
            "already_free": len(self.idle),
            "snapshot": self.snapshot,
        }
        return RepackPlan(**{**defaults, **fields})

    def greedy_plan(
        self,
        count: int,
        greedy: tuple[tuple[Move, ...], tuple[int, ...], FleetSnapshot],
        status: str,
        reason: str,
    ) -> RepackPlan:
        moves, freed, after = greedy
        return self.plan(
            count,
            feasible=True,
            moves=moves,
            freed=freed,
            cost=sum(1 for m in moves if m.occupied),
            status=status,
            reason=reason,
            snapshot=after,
        )

    def fallback(
        self,
        count: int,
        greedy: tuple[tuple[Move, ...], tuple[int, ...], FleetSnapshot],
        status: str,
        why: str,
    ) -> RepackPlan:
        if len(greedy[1]) < count:
            return self.infeasible(count, status, greedy, f"{why}, and the greedy plan")
        return self.greedy_plan(count, greedy, status, f"greedy plan: {why}")

    def infeasible(
        self,
        count: int,
        status: str,
        greedy: tuple[tuple[Move, ...], tuple[int, ...], FleetSnapshot],
        who: str = "",
    ) -> RepackPlan:
        candidates = len(self.candidates)
        if candidates < count:
            pinned = (
                f"; {len(self.unmovable)} hold replicas that cannot move" if self.unmovable else ""
            )
            reason = (
                f"Only {candidates} GPU(s) of {self.product_key} hold replicas that can all "
                f"move{pinned} ({len(self.idle)} already free)."
            )
        else:
            by = f" ({who} frees {len(greedy[1])})" if who else ""
            reason = (
                f"The replicas of no {count} GPU(s) of {self.product_key} fit on the GPUs left"
                f"{by}; at most {len(greedy[1])} can be emptied by the greedy plan."
            )
        method = "cp-sat" if status in _SOLVER_STATUSES else "greedy"
        return self.plan(count, status=status, reason=reason, method=method, bound=0)

    def decide(
        self,
        count: int,
        greedy: tuple[tuple[Move, ...], tuple[int, ...], FleetSnapshot],
        solved: _Solved,
    ) -> RepackPlan:
        greedy_ok = len(greedy[1]) >= count
        greedy_cost = sum(1 for m in greedy[0] if m.occupied)
        if self.restricted and solved.status == "infeasible":
            solved = replace(solved, status="unknown")  # only among the cheapest candidates
        if not solved.emptied:
            if greedy_ok:
                why = f"greedy plan: CP-SAT found none ({solved.status})"
                return self.greedy_plan(count, greedy, solved.status, why)
            return self.infeasible(count, solved.status, greedy)
        realised = self.realise(solved)
        if realised is None or (greedy_ok and greedy_cost < _cost(realised[0])):
            if greedy_ok:
                why = "greedy plan: it moves fewer replicas than CP-SAT found in time"
                return self.greedy_plan(count, greedy, solved.status, why)
            return self.infeasible(count, solved.status, greedy)
        moves, after = realised
        proven = 0 if self.restricted else solved.bound
        bound = max(proven, self.cheap_bound(count))
        cost = _cost(moves)
        optimal = solved.status == "optimal" and (not self.restricted or cost == bound)
        status, reason = solved.status, ""
        if solved.status == "optimal" and not optimal:
            status = "feasible"
            reason = f"optimal among the {len(self.modelled)} cheapest GPUs the model holds"
        return self.plan(
            count,
            feasible=True,
            moves=moves,
            freed=solved.emptied,
            cost=cost,
            bound=cost if optimal else min(bound, cost),
            method="cp-sat",
            status=status,
            reason=reason,
            snapshot=after,
        )

    def realise(self, solved: _Solved) -> tuple[tuple[Move, ...], FleetSnapshot] | None:
        """The moves of a solution, replayed with :func:`check` (``None``: a rule refused)."""
        where = _mig_places(self.snapshot, self.replicas, solved)
        if where is None:
            return None
        current = self.snapshot
        moves: list[Move] = []
        for gpu_id in solved.emptied:
            for replica in self.replicas[gpu_id]:
                step = _step(current, replica, solved.landing.get(replica.key), where)
                if step is None:
                    return None
                move, current = step
                moves.append(move)
        return tuple(moves), current


def _cost(moves: Sequence[Move]) -> int:
    return sum(1 for m in moves if m.occupied)


def _idle(gpu: GpuState) -> bool:
    """Nothing placed, whatever its mode (idle MIG instances may stay: they hold no replica)."""
    busy = any(p.occupied for p in gpu.partitions)
    return not busy and not gpu.mps_reservations and not gpu.taken


def _pinned(gpu: GpuState) -> str:
    if gpu.mode == "dedicated" and gpu.whole_partition_id is None:
        return "runs a whole-GPU workload Fleet did not place"
    if gpu.mode == "mig" and any(p.mps is not None and p.occupied for p in gpu.partitions):
        return "runs MPS clients inside a MIG instance (not moved by repack)"
    if gpu.mode not in ("dedicated", "mig", "mps"):
        return f"is in an unknown mode {gpu.mode}"
    return ""


def _replicas_of(
    gpu: GpuState,
    demands: Mapping[ReplicaKey, Demand],
    requests: Mapping[ReplicaKey, PlacementRequest],
) -> list[_Replica]:
    if gpu.mode == "dedicated":
        assert gpu.whole_partition_id is not None
        key = ("gpu", gpu.whole_partition_id)
        return [_Replica(key, gpu.id, WholeGpuRequest(1), demands.get(key))]
    if gpu.mode == "mps":
        ids = gpu.mps_reservation_ids or tuple(range(len(gpu.mps_reservations)))
        return [
            _Replica(("mps", i), gpu.id, r, demands.get(("mps", i)))
            for i, r in zip(ids, gpu.mps_reservations, strict=True)
        ]
    return [
        _Replica(
            ("mig", p.id),
            gpu.id,
            requests.get(("mig", p.id), MigRequest(p.profile_id)),
            demands.get(("mig", p.id)),
            p.occupied,
        )
        for p in gpu.partitions
    ]


def _solve(
    cp_model: ModuleType,
    problem: _Problem,
    pairs: dict[ReplicaKey, list[int]],
    count: int,
    greedy: tuple[tuple[Move, ...], tuple[int, ...], FleetSnapshot],
    time_limit_s: float,
) -> _Solved:
    model = cp_model.CpModel()
    empty = {g: model.new_bool_var(f"empty{g}") for g in problem.modelled}
    model.add(sum(empty.values()) == count)
    moves: dict[tuple[ReplicaKey, int], Any] = {}
    arriving: dict[int, list[tuple[_Replica, Any]]] = defaultdict(list)
    for gpu_id in problem.modelled:
        for replica in problem.replicas[gpu_id]:
            if not replica.occupied:
                continue
            row = []
            for target in pairs[replica.key]:
                x = moves[(replica.key, target)] = model.new_bool_var("")
                if target in empty:
                    model.add_implication(x, empty[target].Not())
                arriving[target].append((replica, x))
                row.append(x)
            model.add(sum(row) == empty[gpu_id])
    for target, arrivals in arriving.items():
        _capacity(model, problem.snapshot.gpu(target), arrivals)
    cost = sum(problem.occupied(g) * y for g, y in empty.items())
    # A solution at the cheap bound is then proven optimal at once.
    model.add(cost >= problem.cheap_bound(count))
    model.minimize(cost)
    if len(greedy[1]) >= count:  # the greedy plan as a complete hint, where the model has it
        hinted: dict[ReplicaKey, int | None] = {
            (m.kind, m.allocation_id): m.to_gpu for m in greedy[0] if m.occupied
        }
        for gpu_id, y in empty.items():
            model.add_hint(y, gpu_id in greedy[1])
        for (key, target), x in moves.items():
            model.add_hint(x, hinted.get(key) == target)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = SOLVER_WORKERS
    solver.parameters.random_seed = 0
    status = solver.solve(model)
    name = {
        cp_model.OPTIMAL: "optimal",
        cp_model.FEASIBLE: "feasible",
        cp_model.INFEASIBLE: "infeasible",
    }.get(status, "unknown")
    if name not in ("optimal", "feasible"):
        return _Solved(name, (), {}, 0)
    emptied = tuple(g for g, y in empty.items() if solver.value(y))
    landing = {key: target for (key, target), x in moves.items() if solver.value(x)}
    bound = math.ceil(solver.best_objective_bound - 1e-6)
    return _Solved(name, emptied, landing, bound)


def _capacity(model: Any, gpu: GpuState | None, arrivals: list[tuple[_Replica, Any]]) -> None:
    """What several arrivals share on one GPU (each pair alone was checked already)."""
    assert gpu is not None
    if gpu.mode == "dedicated":
        model.add(sum(x for _, x in arrivals) <= 1)
    elif gpu.mode == "mps":
        free_mib, slots, *_ = share_state(gpu.whole_mps())
        mps = [(r.request, x) for r, x in arrivals if isinstance(r.request, MpsRequest)]
        model.add(sum(req.memory_mib * x for req, x in mps) <= free_mib)
        model.add(sum(x for _, x in mps) <= slots)
    elif gpu.mode == "mig":
        _mig_capacity(model, gpu, arrivals)


def _mig_capacity(model: Any, gpu: GpuState, arrivals: list[tuple[_Replica, Any]]) -> None:
    by_profile: dict[int, list[Any]] = defaultdict(list)
    for replica, x in arrivals:
        pid = _profile_id(gpu, replica.request)
        if pid is not None:
            by_profile[pid].append(x)
    profiles = sorted(by_profile)
    options = _maximal_arrivals(gpu, profiles)
    chosen = [model.new_bool_var("") for _ in options]
    model.add(sum(chosen) == 1)
    for k, pid in enumerate(profiles):
        model.add(
            sum(by_profile[pid]) <= sum(v[k] * z for v, z in zip(options, chosen, strict=True))
        )


def _maximal_arrivals(gpu: GpuState, profiles: list[int]) -> list[tuple[int, ...]]:
    """The maximal counts per profile of new replicas that fit on ``gpu`` together."""
    product = migfit.product_of(gpu)
    if product is None or not profiles:
        return [tuple(0 for _ in profiles)]
    existing = tuple(Instance(p.profile_id, p.start) for p in gpu.partitions)
    idle = Counter(p.profile_id for p in gpu.partitions if not p.occupied and p.mps is None)
    key = ("repack.arrivals", existing, tuple(sorted(idle.items())), tuple(profiles))

    def compute() -> list[tuple[int, ...]]:
        return _enumerate(product, existing, idle, profiles)

    found: list[tuple[int, ...]] = migfit.memoised(product, key, compute)
    return found


def _enumerate(
    product: Product, existing: tuple[Instance, ...], idle: Counter[int], profiles: list[int]
) -> list[tuple[int, ...]]:
    feasible: set[tuple[int, ...]] = set()
    stack = [tuple(0 for _ in profiles)]
    while stack:
        vector = stack.pop()
        if vector in feasible:
            continue
        feasible.add(vector)
        for k in range(len(profiles)):
            grown = tuple(v + (i == k) for i, v in enumerate(vector))
            if (
                grown not in feasible
                and _new_instances(product, existing, idle, profiles, grown) is not None
            ):
                stack.append(grown)
    return [
        v
        for v in feasible
        if not any(tuple(c + (i == k) for i, c in enumerate(v)) in feasible for k in range(len(v)))
    ]


def _new_instances(
    product: Product,
    existing: tuple[Instance, ...],
    idle: Counter[int],
    profiles: list[int],
    vector: tuple[int, ...],
) -> tuple[Instance, ...] | None:
    """The instances to create for ``vector`` arrivals (idle instances taken first)."""
    wanted = [
        pid for pid, n in zip(profiles, vector, strict=True) for _ in range(max(0, n - idle[pid]))
    ]
    if not wanted:
        return ()
    if len(wanted) + len(existing) > product.max_instances:
        return None
    return suggest_layout(product, wanted, existing)


def _mig_places(
    snapshot: FleetSnapshot, replicas: dict[int, list[_Replica]], solved: _Solved
) -> dict[ReplicaKey, tuple[int | None, int | None]] | None:
    """For each MIG arrival: the idle partition it takes, or the start of its new instance."""
    arriving: dict[int, list[_Replica]] = defaultdict(list)
    for gpu_id in solved.emptied:
        for replica in replicas[gpu_id]:
            target = solved.landing.get(replica.key)
            if target is not None and isinstance(replica.request, MigRequest):
                arriving[target].append(replica)
    places: dict[ReplicaKey, tuple[int | None, int | None]] = {}
    for target_id, group in arriving.items():
        gpu = snapshot.gpu(target_id)
        product = migfit.product_of(gpu) if gpu is not None else None
        if gpu is None or product is None:
            return None
        free = [p for p in gpu.partitions if not p.occupied and p.mps is None]
        new: list[_Replica] = []
        ids = {r.key: _profile_id(gpu, r.request) for r in group}
        if None in ids.values():
            return None
        for replica in group:
            pid = ids[replica.key]
            reuse = next((p for p in free if p.profile_id == pid), None)
            if reuse is not None:
                free.remove(reuse)
                places[replica.key] = (reuse.id, None)
            else:
                new.append(replica)
        existing = tuple(Instance(p.profile_id, p.start) for p in gpu.partitions)
        wanted = [int(ids[r.key] or 0) for r in new]
        created = suggest_layout(product, wanted, existing) if wanted else ()
        if created is None:
            return None
        starts: dict[int, list[int]] = defaultdict(list)
        for instance in created:
            starts[instance.profile_id].append(instance.start)
        for replica in new:
            places[replica.key] = (None, starts[int(ids[replica.key] or 0)].pop())
    return places


def _step(
    snapshot: FleetSnapshot,
    replica: _Replica,
    target_id: int | None,
    places: dict[ReplicaKey, tuple[int | None, int | None]],
) -> tuple[Move, FleetSnapshot] | None:
    """One move checked and applied: the replica leaves its GPU and lands on ``target_id``."""
    source = snapshot.gpu(replica.gpu_id)
    assert source is not None
    kind, allocation_id = replica.key
    left = replace(
        snapshot,
        gpus=tuple(_without(g, replica) if g.id == source.id else g for g in snapshot.gpus),
    )
    if not replica.occupied:
        return Move("mig", allocation_id, source.id, None, occupied=False), left
    if target_id is None:
        return None
    partition_id, start = places.get(replica.key, (None, None))
    verdict = check(
        left,
        replica.request,
        gpu_id=target_id,
        partition_id=partition_id,
        start=start,
        strategy="first_fit",
        demand=replica.demand,
    )
    if not isinstance(verdict, Target):
        return None
    after = apply_target(left, replica.request, verdict)
    move = Move(
        kind,  # type: ignore[arg-type]
        allocation_id,
        source.id,
        target_id,
        None if kind == "gpu" else verdict.partition_id,
        verdict.new_instance,
    )
    return move, after


def _profile_id(gpu: GpuState, request: PlacementRequest) -> int | None:
    """The id, on ``gpu``'s product, of the profile a MIG request names (``None``: not MIG, or
    a profile the product lacks)."""
    if not isinstance(request, MigRequest):
        return None
    found = migfit.profile_on(gpu, request.profile)
    return None if isinstance(found, Violation) else found[1].id


def _without(gpu: GpuState, replica: _Replica) -> GpuState:
    kind, allocation_id = replica.key
    if kind == "gpu":
        return replace(gpu, taken=False)
    if kind == "mig":
        return replace(gpu, partitions=tuple(p for p in gpu.partitions if p.id != allocation_id))
    ids = gpu.mps_reservation_ids or tuple(range(len(gpu.mps_reservations)))
    k = ids.index(allocation_id)
    return replace(
        gpu,
        mps_reservations=gpu.mps_reservations[:k] + gpu.mps_reservations[k + 1 :],
        mps_reservation_ids=gpu.mps_reservation_ids[:k] + gpu.mps_reservation_ids[k + 1 :],
    )
