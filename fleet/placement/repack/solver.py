"""The repack planner: :func:`plan_repack`, and the exact model it hands CP-SAT (which GPUs are
emptied, where each of their replicas lands, what several arrivals share on one GPU)."""

from __future__ import annotations

import importlib
import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from fleet.mig import Instance, Product, suggest_layout
from fleet.mps import MpsRequest
from fleet.placement import migfit
from fleet.placement.defrag import Move
from fleet.placement.repack.problem import Problem
from fleet.placement.repack.replay import mig_profile_id
from fleet.placement.repack.values import (
    DEFAULT_TIME_LIMIT_S,
    MAX_PAIRS,
    MODEL_SLACK,
    SOLVER_WORKERS,
    RepackPlan,
    Replica,
    ReplicaKey,
    Solved,
)
from fleet.placement.rules import share_state
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    PlacementRequest,
)


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
    problem = Problem(snapshot, product_key, demands or {}, requests or {}, pinned or {})
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


def _solve(
    cp_model: ModuleType,
    problem: Problem,
    pairs: dict[ReplicaKey, list[int]],
    count: int,
    greedy: tuple[tuple[Move, ...], tuple[int, ...], FleetSnapshot],
    time_limit_s: float,
) -> Solved:
    model = cp_model.CpModel()
    empty = {g: model.new_bool_var(f"empty{g}") for g in problem.modelled}
    model.add(sum(empty.values()) == count)
    moves: dict[tuple[ReplicaKey, int], Any] = {}
    arriving: dict[int, list[tuple[Replica, Any]]] = defaultdict(list)
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
        return Solved(name, (), {}, 0)
    emptied = tuple(g for g, y in empty.items() if solver.value(y))
    landing = {key: target for (key, target), x in moves.items() if solver.value(x)}
    bound = math.ceil(solver.best_objective_bound - 1e-6)
    return Solved(name, emptied, landing, bound)


def _capacity(model: Any, gpu: GpuState | None, arrivals: list[tuple[Replica, Any]]) -> None:
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


def _mig_capacity(model: Any, gpu: GpuState, arrivals: list[tuple[Replica, Any]]) -> None:
    by_profile: dict[int, list[Any]] = defaultdict(list)
    for replica, x in arrivals:
        pid = mig_profile_id(gpu, replica.request)
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
