"""Offline repacking of MIG requests onto the fewest GPUs, with a proven lower bound.

Exact model (OR-Tools CP-SAT, imported lazily): every valid layout of the requested profiles
(``fleet.mig.valid_layouts``, so real placements, instance counts and media rules hold) reduces
to its multiset of profiles, a *configuration*; an integer count per configuration must cover the
requests, and the total count is minimised. A packing is exactly a choice of configurations, so
the optimum of this model is the optimum of the packing, and CP-SAT's objective bound is a proven
lower bound. The model has one variable per configuration (about 130 on the 8-slice products)
whatever the number of requests, so thousands of requests solve in well under a second, where an
interval model (one placement choice per request and GPU) would not.

Without ortools, or when the solver finds nothing better in the time limit, the answer is the
heuristic: first fit decreasing with the fit of :mod:`fleet.placement.benchmarks.migfleet`.
"""

from __future__ import annotations

import importlib
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

from fleet.mig import Instance, Product, Profile, UnknownProfileError, valid_layouts
from fleet.placement.benchmarks.migfleet import Layout, MigFleet, strategy_scorer

Solver = Literal["cp-sat", "heuristic"]
DEFAULT_TIME_LIMIT_S = 10.0
SOLVER_WORKERS = 2

Multiset = tuple[int, ...]
"""Profile ids of a layout, sorted."""


@dataclass(frozen=True)
class RepackResult:
    """A packing of requests onto GPUs.

    Attributes:
        bins: one layout per GPU used, each valid for the product.
        gpus_used: ``len(bins)``.
        lower_bound: no packing uses fewer GPUs (proven).
        optimal: ``gpus_used == lower_bound``.
        solver: ``cp-sat`` when the solver's answer is used, else ``heuristic``.
        assignment: for each request (in input order), the index of its GPU in ``bins``.
    """

    bins: tuple[Layout, ...]
    gpus_used: int
    lower_bound: int
    optimal: bool
    solver: Solver
    assignment: tuple[int, ...]


def load_cp_model() -> ModuleType | None:
    """``ortools.sat.python.cp_model``, or ``None`` when OR-Tools is not installed."""
    try:
        return importlib.import_module("ortools.sat.python.cp_model")
    except ImportError:
        return None


def repack(
    requests: Sequence[int | str],
    product: Product,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> RepackResult:
    """Pack MIG requests (profile ids or names) onto the fewest GPUs of ``product``.

    Args:
        requests: one profile per requested instance.
        product: the GPU product.
        time_limit_s: wall-clock limit for CP-SAT.

    Returns:
        The packing; ``optimal`` says whether it is proven to use the fewest GPUs.

    Raises:
        UnknownProfileError: a request the product does not offer.
    """
    profiles = _resolve(product, requests)
    bound = lower_bound(product, profiles)
    heuristic = first_fit_decreasing(product, profiles)
    if len(heuristic) > bound:
        solved = _solve(product, profiles, heuristic, bound, time_limit_s)
        if solved is not None:
            bins, solver_bound, proven = solved
            bound = max(bound, solver_bound if not proven else len(bins))
            if len(bins) < len(heuristic) or proven:
                return _result(profiles, bins, bound, "cp-sat")
    return _result(profiles, heuristic, bound, "heuristic")


def lower_bound(product: Product, profiles: Sequence[Profile]) -> int:
    """A proven lower bound on the GPUs any packing of ``profiles`` needs (no solver).

    The largest of: Martello and Toth's L2 bound on compute slices and on memory slices (each a
    one-dimensional relaxation, with the capacity read off the product's valid layouts, which
    covers "items above half a GPU each need their own"), the instance count over the most
    instances per GPU, and per profile its count over its own per-GPU limit.
    """
    if not profiles:
        return 0
    layouts = valid_layouts(product, sorted({p.id for p in profiles}))
    by_id = {p.id: p for p in profiles}
    compute_cap = max(sum(by_id[i.profile_id].compute_slices for i in lay) for lay in layouts)
    memory_cap = max(sum(by_id[i.profile_id].memory_slices for i in lay) for lay in layouts)
    count_cap = max(len(layout) for layout in layouts)
    counts = Counter(p.id for p in profiles)
    per_profile = max(
        math.ceil(n / max(sum(1 for i in lay if i.profile_id == pid) for lay in layouts))
        for pid, n in counts.items()
    )
    return max(
        _l2([p.compute_slices for p in profiles], compute_cap),
        _l2([p.memory_slices for p in profiles], memory_cap),
        math.ceil(len(profiles) / count_cap),
        per_profile,
    )


def _l2(sizes: Sequence[int], capacity: int) -> int:
    """Martello and Toth's L2 lower bound for one-dimensional bin packing."""
    best = 0
    for alpha in {0, *(s for s in sizes if 2 * s <= capacity)}:
        big = [s for s in sizes if 2 * s > capacity]
        too_big = sum(1 for s in big if s > capacity - alpha)
        middle = [s for s in big if s <= capacity - alpha]
        small = sum(s for s in sizes if alpha <= s and 2 * s <= capacity)
        room = len(middle) * capacity - sum(middle)
        extra = max(0, math.ceil((small - room) / capacity))
        best = max(best, too_big + len(middle) + extra)
    return best


def first_fit_decreasing(product: Product, profiles: Sequence[Profile]) -> tuple[Layout, ...]:
    """Largest profiles first, each on the best-fit GPU (a new one when none fits)."""
    fleet = MigFleet(product, strategy_scorer("best_fit"))
    for profile in sorted(profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, p.id)):
        if fleet.place(profile) is None:
            raise ValueError(f"{profile.name} does not fit on an empty {product.name}")
    return tuple(layout for layout in fleet.layouts if layout)


def _resolve(product: Product, requests: Sequence[int | str]) -> list[Profile]:
    profiles = []
    for ref in requests:
        profile = product.profile(ref)
        if profile is None:
            raise UnknownProfileError(product, ref)
        profiles.append(profile)
    return profiles


def _multiset(layout: Layout) -> Multiset:
    return tuple(sorted(i.profile_id for i in layout))


def _configurations(product: Product, profiles: Sequence[Profile]) -> dict[Multiset, Layout]:
    """One valid layout per non-empty multiset of the requested profiles."""
    found: dict[Multiset, Layout] = {}
    for layout in valid_layouts(product, sorted({p.id for p in profiles})):
        if layout:
            found.setdefault(_multiset(layout), layout)
    return found


def _solve(
    product: Product,
    profiles: Sequence[Profile],
    hint: Sequence[Layout],
    bound: int,
    time_limit_s: float,
) -> tuple[tuple[Layout, ...], int, bool] | None:
    """CP-SAT on the configuration model: (bins, proven bound, optimal), or ``None``."""
    cp_model = load_cp_model()
    if cp_model is None:
        return None
    configs = _configurations(product, profiles)
    needed = Counter(p.id for p in profiles)
    hinted = Counter(_multiset(layout) for layout in hint)
    model = cp_model.CpModel()
    counts = {c: model.new_int_var(0, len(hint), f"x{k}") for k, c in enumerate(configs)}
    for pid, n in needed.items():
        model.add(sum(c.count(pid) * x for c, x in counts.items() if pid in c) >= n)
    total = sum(counts.values())
    model.add(total >= bound)
    model.add(total <= len(hint))
    model.minimize(total)
    for config, var in counts.items():
        model.add_hint(var, hinted.get(config, 0))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = SOLVER_WORKERS
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    chosen = {c: int(solver.value(x)) for c, x in counts.items()}
    bins = _realise(configs, chosen, needed)
    return bins, math.ceil(solver.best_objective_bound - 1e-6), status == cp_model.OPTIMAL


def _realise(
    configs: dict[Multiset, Layout], chosen: dict[Multiset, int], needed: Counter[int]
) -> tuple[Layout, ...]:
    """Layouts for the chosen configurations, dropping instances beyond what was requested."""
    left = Counter(needed)
    bins: list[Layout] = []
    for config, copies in chosen.items():
        for _ in range(copies):
            kept: list[Instance] = []
            for instance in configs[config]:
                if left[instance.profile_id] > 0:
                    left[instance.profile_id] -= 1
                    kept.append(instance)
            if kept:
                bins.append(tuple(kept))
    return tuple(bins)


def _result(
    profiles: Sequence[Profile], bins: Sequence[Layout], bound: int, solver: Solver
) -> RepackResult:
    slots: dict[int, list[int]] = {}
    for index, layout in enumerate(bins):
        for instance in layout:
            slots.setdefault(instance.profile_id, []).append(index)
    for queue in slots.values():
        queue.reverse()
    assignment = tuple(slots[p.id].pop() for p in profiles)
    return RepackResult(tuple(bins), len(bins), bound, len(bins) == bound, solver, assignment)
