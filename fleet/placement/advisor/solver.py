"""CP-SAT on the layout advisor's problem (a configuration model: GPUs in the same state form
a class, and each class chooses how many of its GPUs take each valid layout), with the greedy
plan as its hint and as the answer without OR-Tools or without a solution in time."""

from __future__ import annotations

import importlib
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import Any

from fleet.mig import Instance, Product, valid_layouts
from fleet.placement.advisor.problem import Problem, Solution
from fleet.placement.advisor.values import (
    DEFAULT_TIME_LIMIT_S,
    Advice,
    AdvisorGpu,
    ExistingInstance,
    WaitingMig,
    WaitingMps,
)

SOLVER_WORKERS = 8


def load_cp_model() -> ModuleType | None:
    """``ortools.sat.python.cp_model``, or ``None`` when OR-Tools is not installed."""
    try:
        return importlib.import_module("ortools.sat.python.cp_model")
    except ImportError:
        return None


def advise(
    gpus: Sequence[AdvisorGpu],
    mig: Sequence[WaitingMig],
    mps: Sequence[WaitingMps] = (),
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    clock: Callable[[], float] | None = None,
) -> Advice:
    """Layouts that place the most waiting replicas, moving the fewest running ones.

    Args:
        gpus: the product's schedulable GPUs (all of one product family).
        mig: waiting MIG replicas.
        mps: waiting MPS replicas (placed in new MIG instances that run MPS).
        time_limit_s: CP-SAT's wall-clock limit.
        clock: seconds, monotonic (the caller's; the pure package has no clock).

    Returns:
        The advice; every layout in it is valid by :func:`fleet.mig.validate_layout`.
    """
    problem = Problem(gpus, mig, mps)
    if not gpus or not (mig or mps) or not problem.positions:
        return problem.advice(problem.greedy(), "trivial", None, 0.0)
    cp_model = load_cp_model()
    if cp_model is None:
        return problem.advice(problem.greedy(), "heuristic", None, 0.0)
    return solve(problem, cp_model, time_limit_s, clock)


@dataclass(frozen=True)
class _Option:
    """One choice for a GPU of a class: its layout, profile counts, the running replicas it
    moves (a drain) and the idle instances it destroys."""

    layout: tuple[Instance, ...]
    counts: Counter[int]
    moved: int
    destroyed: int


_Keyed = tuple[tuple[Instance, ...], frozenset[tuple[int, int]], tuple[int, ...]]


@lru_cache(maxsize=32)
def _layouts(product: Product, profile_ids: tuple[int, ...]) -> tuple[_Keyed, ...]:
    """Every valid layout of these profiles, with its positions and its multiset of profiles."""
    return tuple(
        (
            layout,
            frozenset((i.profile_id, i.start) for i in layout),
            tuple(sorted(i.profile_id for i in layout)),
        )
        for layout in valid_layouts(product, list(profile_ids))
    )


def solve(
    problem: Problem, cp_model: Any, time_limit_s: float, clock: Callable[[], float] | None
) -> Advice:
    """CP-SAT on the configuration model: GPUs in the same state form a class; each class
    chooses how many of its GPUs take each option (a valid layout that keeps the class's
    running instances, or a drained one), whose LP relaxation is tight."""
    classes = _classes(problem)
    m = cp_model.CpModel()
    z: dict[tuple[int, int], Any] = {}
    for c, (members, options) in enumerate(classes):
        for o in range(len(options)):
            z[(c, o)] = m.new_int_var(0, len(members), f"z{c}_{o}")
        m.add(sum(z[(c, o)] for o in range(len(options))) == len(members))
    mig_used = {w.key: m.new_int_var(0, w.count, f"m{k}") for k, w in enumerate(problem.mig)}
    mps_n = {
        key: m.new_int_var(0, math.ceil(problem.mps_count(key[0]) / cap), f"n{key}")
        for key, cap in problem.mps_caps.items()
    }
    mps_placed = []
    for k, w in enumerate(problem.mps):
        placed = m.new_int_var(0, w.count, f"s{k}")
        capacity = [cap * mps_n[(key, pid)] for (key, pid), cap in problem.mps_caps.items()]
        m.add(
            placed
            <= sum(capacity[i] for i, (key, _) in enumerate(problem.mps_caps) if key == w.key)
        )
        mps_placed.append(placed)
    spares = []
    spare_vars: dict[int, Any] = {}
    for pid in problem.profile_ids:
        total = sum(
            options[o].counts[pid] * z[(c, o)]
            for c, (_, options) in enumerate(classes)
            for o in range(len(options))
            if options[o].counts[pid]
        )
        used = sum(mig_used[w.key] for w in problem.mig if w.profile_id == pid)
        used += sum(n for (_, p), n in mps_n.items() if p == pid)
        spare = m.new_int_var(0, len(problem.gpus) * 7, f"spare{pid}")
        m.add(total == problem.busy[pid] + used + spare)
        spares.append(spare)
        spare_vars[pid] = spare
    moves = sum(
        options[o].moved * z[(c, o)]
        for c, (_, options) in enumerate(classes)
        for o in range(len(options))
        if options[o].moved
    )
    destroyed = sum(
        options[o].destroyed * z[(c, o)]
        for c, (_, options) in enumerate(classes)
        for o in range(len(options))
        if options[o].destroyed
    )
    placed_total = sum(mig_used.values()) + sum(mps_placed)
    m.maximize(
        problem.w_place * placed_total
        - problem.w_move * moves
        - problem.w_tidy * (2 * destroyed + sum(spares) + sum(mps_n.values()))
    )
    _hint(problem, m, classes, z, mig_used, mps_n, spare_vars)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = SOLVER_WORKERS
    started = clock() if clock is not None else 0.0
    status = solver.solve(m)
    elapsed = (clock() - started) if clock is not None else solver.wall_time
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # No solution within the limit: the greedy plan, against the solver's bound.
        proven = solver.best_objective_bound
        bound = math.floor(proven + 1e-6) if math.isfinite(proven) else None
        return problem.advice(problem.greedy(), "heuristic", bound, elapsed)
    solution = Solution(set(), set(), {}, {})
    for c, (members, options) in enumerate(classes):
        queue = list(members)
        for o, option in enumerate(options):
            for _ in range(int(solver.value(z[(c, o)]))):
                index = queue.pop(0)
                solution.chosen |= {(index, i.profile_id, i.start) for i in option.layout}
                if option.moved:
                    solution.drained.add(index)
    solution.mig_used = {key: int(solver.value(v)) for key, v in mig_used.items()}
    solution.mps_instances = {key: int(solver.value(v)) for key, v in mps_n.items()}
    name = "optimal" if status == cp_model.OPTIMAL else "feasible"
    bound = math.floor(solver.best_objective_bound + 1e-6)
    return problem.advice(solution, name, bound, elapsed)


def _classes(problem: Problem) -> list[tuple[list[int], list[_Option]]]:
    """GPUs grouped by (product, instances), each class with its options."""
    groups: dict[tuple[Product, tuple[ExistingInstance, ...], bool], list[int]] = {}
    for index, g in enumerate(problem.gpus):
        instances = tuple(sorted(g.instances, key=lambda i: (i.start, i.profile_id)))
        groups.setdefault((g.product, instances, g.drainable), []).append(index)
    return [
        (members, _options(problem, product, instances, drainable))
        for (product, instances, drainable), members in groups.items()
    ]


def _options(
    problem: Problem,
    product: Product,
    instances: tuple[ExistingInstance, ...],
    drainable: bool = True,
) -> list[_Option]:
    """Per multiset of profiles: the layout that keeps the running instances (if any) and
    the most idle ones; and, on a GPU with running replicas, the drained layout that keeps
    the most instances."""
    busy = {(i.profile_id, i.start) for i in instances if i.replicas}
    idle = {(i.profile_id, i.start) for i in instances if not i.replicas}
    replicas = sum(i.replicas for i in instances)
    best: dict[tuple[bool, tuple[int, ...]], tuple[int, tuple[Instance, ...]]] = {}
    for layout, here, multiset in _layouts(product, tuple(problem.profile_ids)):
        drained = not busy <= here
        if drained and (not replicas or not drainable):
            continue
        key = (drained, multiset)
        kept = len(here & idle) if idle else 0
        if key not in best or kept > best[key][0]:
            best[key] = (kept, layout)
    return [
        _Option(
            layout,
            Counter(i.profile_id for i in layout),
            replicas if drained else 0,
            len(idle) - kept,
        )
        for (drained, _), (kept, layout) in best.items()
    ]


def _hint(
    problem: Problem,
    m: Any,
    classes: list[tuple[list[int], list[_Option]]],
    z: dict[tuple[int, int], Any],
    mig_used: dict[str, Any],
    mps_n: dict[tuple[str, int], Any],
    spare_vars: dict[int, Any],
) -> None:
    greedy = problem.greedy()
    totals = Counter(pid for _, pid, _ in greedy.chosen)
    for pid, v in spare_vars.items():
        used = sum(greedy.mig_used.get(w.key, 0) for w in problem.mig if w.profile_id == pid)
        used += sum(n for (_, p), n in greedy.mps_instances.items() if p == pid)
        m.add_hint(v, max(0, totals[pid] - problem.busy[pid] - used))
    for c, (members, options) in enumerate(classes):
        wanted: Counter[tuple[int, ...]] = Counter(
            tuple(sorted(pid for index, pid, _ in greedy.chosen if index == member))
            for member in members
        )
        for o, option in enumerate(options):
            multiset = tuple(sorted(i.profile_id for i in option.layout))
            m.add_hint(z[(c, o)], 0 if option.moved else wanted.get(multiset, 0))
    for name, v in mig_used.items():
        m.add_hint(v, greedy.mig_used.get(name, 0))
    for pair, v in mps_n.items():
        m.add_hint(v, greedy.mps_instances.get(pair, 0))
