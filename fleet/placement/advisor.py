"""The layout advisor: MIG layouts for a product's GPUs that place the most waiting replicas
while moving the fewest running ones (CP-SAT, with a time limit).

The model, per GPU, is one boolean per allowed placement of each useful profile (the product's
own NVML placements, so starts, sizes, overlaps, the per-GPU and per-profile instance counts and
the media-extension rules are exactly :mod:`fleet.mig.rules`). Existing busy instances stay where
they are unless their GPU is *drained*; a drained GPU's running replicas all count as moves (a
rollout drains a whole GPU, :mod:`fleet.allocations.drain`), and they need instances of their
profile somewhere in the new layouts. Waiting MIG replicas need an instance of their profile; a
waiting MPS replica can run in a new MIG instance with its own MPS daemon (MPS inside MIG), one
deployment per such instance, as many clients as its memory and the instance's client slots
allow (:meth:`fleet.mps.MpsDevice.mig_instance`).

The objective is lexicographic, folded into one integer: replicas placed first, then the fewest
replicas moved, then the fewest idle instances destroyed and spare instances created.

OR-Tools is imported lazily; without it :func:`advise` answers with the greedy plan (keep every
instance, add the waiting replicas where they fit), status ``heuristic``.
"""

from __future__ import annotations

import importlib
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from types import ModuleType
from typing import Any

from fleet.mig import Instance, Product, Profile, free_placements, valid_layouts
from fleet.mps import MAX_CLIENTS_PER_GPU

DEFAULT_TIME_LIMIT_S = 5.0
SOLVER_WORKERS = 8


@dataclass(frozen=True)
class ExistingInstance:
    """A MIG instance a GPU has now: ``replicas`` running in it (0: idle), ``mps``: it runs an
    MPS daemon."""

    profile_id: int
    start: int
    replicas: int = 0
    mps: bool = False


@dataclass(frozen=True)
class AdvisorGpu:
    """One schedulable GPU of the product (``product``: with its agent-reported placements)."""

    id: int
    product: Product
    instances: tuple[ExistingInstance, ...] = ()
    # False: its running replicas stay where they are (no drained layout is offered for it).
    drainable: bool = True
    # The other GPUs that every running replica of it may move to (the hosts their deployments
    # may use); ``None``: any. A GPU is drained only where its replicas may go to each GPU of
    # the waiting group being solved: the model places a moved replica on any of them.
    movable_to: frozenset[int] | None = None

    @property
    def busy_replicas(self) -> int:
        return sum(i.replicas for i in self.instances)


@dataclass(frozen=True)
class WaitingMig:
    """``count`` unplaced replicas of a deployment (``key``) in instances of ``profile_id``."""

    key: str
    profile_id: int
    count: int


@dataclass(frozen=True)
class WaitingMps:
    """``count`` unplaced MPS replicas of a deployment (``key``), ``memory_mib`` each."""

    key: str
    memory_mib: int
    count: int
    max_compute_percent: int | None = None


@dataclass(frozen=True)
class NewInstance:
    """An instance of the proposed layout: kept (``existing``: the index of the GPU's instance
    it keeps), or new. ``serves``: the deployment whose waiting replicas it takes (``replicas``
    of them), ``"moved"`` for one that receives a moved instance's replicas, ``""`` for a spare.
    ``mps``: run an MPS daemon in it."""

    profile_id: int
    start: int
    existing: int | None = None
    serves: str = ""
    replicas: int = 0
    mps: bool = False


@dataclass(frozen=True)
class GpuAdvice:
    """One GPU's proposed layout; ``changed``: it differs from the current one; ``drained``:
    its running replicas must move first (a drain)."""

    gpu_id: int
    instances: tuple[NewInstance, ...]
    changed: bool
    drained: bool
    moved_replicas: int


@dataclass(frozen=True)
class Advice:
    """The advisor's answer.

    Attributes:
        gpus: every GPU's proposed layout (changed or not), in the input's order.
        placed: waiting replicas placed, per deployment key.
        waiting: waiting replicas asked for, per deployment key.
        moved_replicas: running replicas that must move (those of drained GPUs).
        objective: the solver's objective value of this answer.
        bound: the solver's proven bound on the objective (equal to ``objective`` when optimal).
        gap_percent: ``100 * (bound - objective) / bound``.
        status: ``optimal``, ``feasible`` (time limit), ``heuristic`` (no solver) or ``trivial``.
        time_s: solver wall time.
    """

    gpus: tuple[GpuAdvice, ...]
    placed: dict[str, int]
    waiting: dict[str, int]
    moved_replicas: int
    objective: int
    bound: int
    gap_percent: float
    status: str
    time_s: float
    weights: dict[str, int] = field(default_factory=dict)

    @property
    def placed_total(self) -> int:
        return sum(self.placed.values())


def mps_instance_capacity(product: Product, profile: Profile, memory_mib: int) -> int:
    """How many MPS clients of ``memory_mib`` one new ``profile`` instance (default policy)
    holds: its memory, and its client slots (48 in proportion to its compute)."""
    if memory_mib < 1 or not product.compute_slice_count:
        return 0
    slots = max(1, MAX_CLIENTS_PER_GPU * profile.compute_slices // product.compute_slice_count)
    return min(profile.memory_mib // memory_mib, slots)


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
    model = _Model(gpus, mig, mps)
    if not gpus or not (mig or mps) or not model.positions:
        return model.advice(model.greedy(), "trivial", None, 0.0)
    cp_model = load_cp_model()
    if cp_model is None:
        return model.advice(model.greedy(), "heuristic", None, 0.0)
    return model.solve(cp_model, time_limit_s, clock)


@dataclass(frozen=True)
class WaitingGroup:
    """Waiting replicas that may run only on some of the GPUs (``gpu_ids``): their deployments
    require host labels, a runtime, or room the other hosts lack."""

    gpu_ids: frozenset[int]
    mig: tuple[WaitingMig, ...] = ()
    mps: tuple[WaitingMps, ...] = ()


def advise_groups(
    gpus: Sequence[AdvisorGpu],
    groups: Sequence[WaitingGroup],
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    clock: Callable[[], float] | None = None,
) -> Advice:
    """:func:`advise` for waiting replicas that may not all go to every GPU.

    One group that may use every GPU is :func:`advise` itself. Otherwise the groups are solved
    in turn, the one with the fewest GPUs first, each on its own GPUs as the earlier ones left
    them: the instances an earlier group took count as busy, and a GPU an earlier group changed
    or took instances of is not drained again (its new replicas would move to GPUs their
    deployments may not use). With several groups the answer's status is ``sequential``
    (unless a step was only ``feasible`` or ``heuristic``, then that): each step is
    solved as :func:`advise` solves it, and ``bound`` is the sum of the steps' bounds, a bound
    of what each step could do from where the earlier ones left it, not of a joint plan.
    """
    if len(groups) == 1 and groups[0].gpu_ids >= {g.id for g in gpus}:
        only = groups[0]
        return advise(
            _pinned(gpus, only.gpu_ids), only.mig, only.mps, time_limit_s=time_limit_s, clock=clock
        )
    state = {g.id: g for g in gpus}
    # Per GPU, its instances now: as the answer's NewInstance (``existing``: the index among
    # the GPU's instances in ``gpus``) and how many replicas each holds.
    plan: dict[int, list[tuple[NewInstance, int]]] = {
        g.id: [
            (NewInstance(i.profile_id, i.start, n, mps=i.mps), i.replicas)
            for n, i in enumerate(g.instances)
        ]
        for g in gpus
    }
    drained: set[int] = set()
    placed: Counter[str] = Counter()
    waiting: Counter[str] = Counter()
    objective = bound = 0
    elapsed = 0.0
    statuses: list[str] = []
    weights: dict[str, int] = {}
    steps = sorted(groups, key=lambda group: (len(group.gpu_ids), sorted(group.gpu_ids)))
    for group in steps:
        members = _pinned([state[g.id] for g in gpus if g.id in group.gpu_ids], group.gpu_ids)
        step = advise(
            members, group.mig, group.mps, time_limit_s=time_limit_s / len(steps), clock=clock
        )
        placed.update(step.placed)
        waiting.update(step.waiting)
        objective += step.objective
        bound += step.bound
        elapsed += step.time_s
        statuses.append(step.status)
        weights = weights or step.weights
        for proposal in step.gpus:
            if not proposal.changed and not any(i.serves for i in proposal.instances):
                continue
            before = plan[proposal.gpu_id]
            after: list[tuple[NewInstance, int]] = []
            for i in proposal.instances:
                kept = before[i.existing] if i.existing is not None else None
                original = kept[0].existing if kept is not None else None
                if kept is not None and not proposal.drained and not i.serves:
                    after.append(kept)  # as it was: running, or taken by an earlier step, or idle
                else:
                    after.append(
                        (
                            NewInstance(
                                i.profile_id, i.start, original, i.serves, i.replicas, i.mps
                            ),
                            i.replicas,
                        )
                    )
            plan[proposal.gpu_id] = after
            if proposal.drained:
                drained.add(proposal.gpu_id)
            g = state[proposal.gpu_id]
            state[proposal.gpu_id] = AdvisorGpu(
                g.id,
                g.product,
                tuple(ExistingInstance(i.profile_id, i.start, n, i.mps) for i, n in after),
                drainable=False,
            )
    answer: list[GpuAdvice] = []
    for g in gpus:
        instances = tuple(i for i, _ in plan[g.id])
        now = sorted((i.profile_id, i.start, i.mps) for i in g.instances)
        then = sorted((i.profile_id, i.start, i.mps) for i in instances)
        gone = g.id in drained
        answer.append(
            GpuAdvice(g.id, instances, gone or now != then, gone, g.busy_replicas if gone else 0)
        )
    if len(statuses) == 1:  # one group, on some of the GPUs: solved as advise() solves it
        status = statuses[0]
    elif any(status in ("heuristic", "feasible") for status in statuses):
        status = "heuristic" if "heuristic" in statuses else "feasible"
    else:
        status = "sequential"
    gap = 100.0 * (bound - objective) / abs(bound) if bound else 0.0
    return Advice(
        tuple(answer),
        dict(placed),
        dict(waiting),
        sum(a.moved_replicas for a in answer),
        objective,
        bound,
        round(max(gap, 0.0), 4),
        status,
        round(elapsed, 3),
        weights,
    )


def _pinned(gpus: Sequence[AdvisorGpu], ids: frozenset[int]) -> list[AdvisorGpu]:
    """``gpus``, those whose running replicas may not move to every other GPU of ``ids`` made
    not drainable (a drain's replicas may land on any of them)."""
    return [
        replace(g, drainable=False)
        if g.drainable and g.movable_to is not None and not (ids - {g.id}) <= g.movable_to
        else g
        for g in gpus
    ]


Position = tuple[int, int, int]
"""(GPU index in the input, profile id, start)."""


@dataclass
class _Solution:
    chosen: set[Position]
    drained: set[int]
    mig_used: dict[str, int]
    mps_instances: dict[tuple[str, int], int]


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


class _Model:
    """The CP-SAT model's data, the greedy plan (its hint) and the answer's assembly."""

    def __init__(
        self, gpus: Sequence[AdvisorGpu], mig: Sequence[WaitingMig], mps: Sequence[WaitingMps]
    ) -> None:
        self.gpus = list(gpus)
        self.mig = [w for w in mig if w.count > 0]
        self.mps = [w for w in mps if w.count > 0]
        product = gpus[0].product if gpus else None
        wanted: set[int] = {w.profile_id for w in self.mig}
        for g in self.gpus:
            wanted |= {i.profile_id for i in g.instances}
        self.mps_caps: dict[tuple[str, int], int] = {}
        if product is not None:
            for w in self.mps:
                for p in product.profiles:
                    cap = mps_instance_capacity(product, p, w.memory_mib)
                    if p.media == "" and cap >= 1:
                        self.mps_caps[(w.key, p.id)] = cap
                        wanted.add(p.id)
        self.profile_ids = sorted(wanted)
        self.positions: list[Position] = [
            (index, p.id, where.start)
            for index, g in enumerate(self.gpus)
            for p in g.product.profiles
            if p.id in wanted
            for where in p.placements
        ]
        self.busy = Counter(i.profile_id for g in self.gpus for i in g.instances if i.replicas > 0)
        self.total_busy = sum(g.busy_replicas for g in self.gpus)
        idle = sum(1 for g in self.gpus for i in g.instances if i.replicas == 0)
        slots = sum(g.product.max_instances for g in self.gpus)
        self.w_tidy = 1
        self.w_move = 2 * idle + 2 * slots + 1
        self.w_place = self.w_move * (self.total_busy + 1)

    # -- the solver ------------------------------------------------------------------------

    def solve(
        self, cp_model: Any, time_limit_s: float, clock: Callable[[], float] | None
    ) -> Advice:
        """CP-SAT on the configuration model: GPUs in the same state form a class; each class
        chooses how many of its GPUs take each option (a valid layout that keeps the class's
        running instances, or a drained one), whose LP relaxation is tight."""
        classes = self._classes()
        m = cp_model.CpModel()
        z: dict[tuple[int, int], Any] = {}
        for c, (members, options) in enumerate(classes):
            for o in range(len(options)):
                z[(c, o)] = m.new_int_var(0, len(members), f"z{c}_{o}")
            m.add(sum(z[(c, o)] for o in range(len(options))) == len(members))
        mig_used = {w.key: m.new_int_var(0, w.count, f"m{k}") for k, w in enumerate(self.mig)}
        mps_n = {
            key: m.new_int_var(0, math.ceil(self._mps_count(key[0]) / cap), f"n{key}")
            for key, cap in self.mps_caps.items()
        }
        mps_placed = []
        for k, w in enumerate(self.mps):
            placed = m.new_int_var(0, w.count, f"s{k}")
            capacity = [cap * mps_n[(key, pid)] for (key, pid), cap in self.mps_caps.items()]
            m.add(
                placed
                <= sum(capacity[i] for i, (key, _) in enumerate(self.mps_caps) if key == w.key)
            )
            mps_placed.append(placed)
        spares = []
        spare_vars: dict[int, Any] = {}
        for pid in self.profile_ids:
            total = sum(
                options[o].counts[pid] * z[(c, o)]
                for c, (_, options) in enumerate(classes)
                for o in range(len(options))
                if options[o].counts[pid]
            )
            used = sum(mig_used[w.key] for w in self.mig if w.profile_id == pid)
            used += sum(n for (_, p), n in mps_n.items() if p == pid)
            spare = m.new_int_var(0, len(self.gpus) * 7, f"spare{pid}")
            m.add(total == self.busy[pid] + used + spare)
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
            self.w_place * placed_total
            - self.w_move * moves
            - self.w_tidy * (2 * destroyed + sum(spares) + sum(mps_n.values()))
        )
        self._hint(m, classes, z, mig_used, mps_n, spare_vars)
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
            return self.advice(self.greedy(), "heuristic", bound, elapsed)
        solution = _Solution(set(), set(), {}, {})
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
        return self.advice(solution, name, bound, elapsed)

    def _mps_count(self, key: str) -> int:
        return sum(w.count for w in self.mps if w.key == key)

    def _classes(self) -> list[tuple[list[int], list[_Option]]]:
        """GPUs grouped by (product, instances), each class with its options."""
        groups: dict[tuple[Product, tuple[ExistingInstance, ...], bool], list[int]] = {}
        for index, g in enumerate(self.gpus):
            instances = tuple(sorted(g.instances, key=lambda i: (i.start, i.profile_id)))
            groups.setdefault((g.product, instances, g.drainable), []).append(index)
        return [
            (members, self._options(product, instances, drainable))
            for (product, instances, drainable), members in groups.items()
        ]

    def _options(
        self, product: Product, instances: tuple[ExistingInstance, ...], drainable: bool = True
    ) -> list[_Option]:
        """Per multiset of profiles: the layout that keeps the running instances (if any) and
        the most idle ones; and, on a GPU with running replicas, the drained layout that keeps
        the most instances."""
        busy = {(i.profile_id, i.start) for i in instances if i.replicas}
        idle = {(i.profile_id, i.start) for i in instances if not i.replicas}
        replicas = sum(i.replicas for i in instances)
        best: dict[tuple[bool, tuple[int, ...]], tuple[int, tuple[Instance, ...]]] = {}
        for layout, here, multiset in _layouts(product, tuple(self.profile_ids)):
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
        self,
        m: Any,
        classes: list[tuple[list[int], list[_Option]]],
        z: dict[tuple[int, int], Any],
        mig_used: dict[str, Any],
        mps_n: dict[tuple[str, int], Any],
        spare_vars: dict[int, Any],
    ) -> None:
        greedy = self.greedy()
        totals = Counter(pid for _, pid, _ in greedy.chosen)
        for pid, v in spare_vars.items():
            used = sum(greedy.mig_used.get(w.key, 0) for w in self.mig if w.profile_id == pid)
            used += sum(n for (_, p), n in greedy.mps_instances.items() if p == pid)
            m.add_hint(v, max(0, totals[pid] - self.busy[pid] - used))
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

    # -- the greedy plan -------------------------------------------------------------------

    def greedy(self) -> _Solution:
        """The best of four plans that move nothing: keep or drop the idle instances, and add
        the waiting replicas first-fit, largest or smallest profiles first."""
        plans = [self._greedy(drop, small) for drop in (False, True) for small in (False, True)]
        return max(plans, key=lambda plan: self._objective(plan, self._placed(plan), 0))

    def _placed(self, plan: _Solution) -> int:
        placed = sum(plan.mig_used.values())
        for w in self.mps:
            room = sum(
                self.mps_caps[pair] * n
                for pair, n in plan.mps_instances.items()
                if pair[0] == w.key
            )
            placed += min(w.count, room)
        return placed

    def _greedy(self, drop_idle: bool, smallest_first: bool) -> _Solution:
        layouts = [
            [Instance(i.profile_id, i.start) for i in g.instances if i.replicas or not drop_idle]
            for g in self.gpus
        ]
        spare = Counter(
            i.profile_id
            for g in self.gpus
            for i in g.instances
            if i.replicas == 0 and not drop_idle
        )
        mig_used: dict[str, int] = {}
        demands: list[tuple[str, int, int]] = [(w.key, w.profile_id, w.count) for w in self.mig]
        product = self.gpus[0].product if self.gpus else None
        for w in self.mps:
            best = min(
                ((pid, cap) for (key, pid), cap in self.mps_caps.items() if key == w.key),
                key=lambda pc: _profile_size(product, pc[0]) / pc[1],
                default=None,
            )
            if best is not None:
                demands.append((w.key, best[0], -math.ceil(w.count / best[1])))
        mps_instances: dict[tuple[str, int], int] = {}
        sign = 1 if smallest_first else -1
        demands.sort(key=lambda d: sign * _profile_size(product, d[1]))
        for key, pid, count in demands:
            done = 0
            for _ in range(abs(count)):
                if spare[pid] > 0:
                    spare[pid] -= 1
                    done += 1
                    continue
                if not self._add_first_fit(layouts, pid):
                    break
                done += 1
            if count >= 0:
                mig_used[key] = done
            else:
                mps_instances[(key, pid)] = done
        chosen = {
            (index, i.profile_id, i.start) for index, layout in enumerate(layouts) for i in layout
        }
        return _Solution(chosen, set(), mig_used, mps_instances)

    def _add_first_fit(self, layouts: list[list[Instance]], pid: int) -> bool:
        for index, g in enumerate(self.gpus):
            options = free_placements(g.product, pid, layouts[index])
            if options:
                layouts[index].append(Instance(pid, options[-1].start))
                return True
        return False

    # -- the answer ------------------------------------------------------------------------

    def advice(self, solution: _Solution, status: str, bound: int | None, elapsed: float) -> Advice:
        """Assign purposes to the chosen instances and build the answer."""
        purposes = self._purposes(solution)
        gpus: list[GpuAdvice] = []
        for index, g in enumerate(self.gpus):
            kept = {(i.profile_id, i.start): n for n, i in enumerate(g.instances)}
            instances = []
            for pos in sorted(p for p in solution.chosen if p[0] == index):
                existing = kept.get(pos[1:])
                old = g.instances[existing] if existing is not None else None
                if old is not None and old.replicas and index not in solution.drained:
                    instances.append(NewInstance(pos[1], pos[2], existing, mps=old.mps))
                    continue
                serves, replicas, mps = purposes.get(pos, ("", 0, old.mps if old else False))
                instances.append(NewInstance(pos[1], pos[2], existing, serves, replicas, mps))
            now = sorted((i.profile_id, i.start, i.mps) for i in g.instances)
            after = sorted((i.profile_id, i.start, i.mps) for i in instances)
            drained = index in solution.drained
            gpus.append(
                GpuAdvice(
                    g.id,
                    tuple(instances),
                    changed=drained or now != after,
                    drained=drained,
                    moved_replicas=g.busy_replicas if drained else 0,
                )
            )
        placed: Counter[str] = Counter()
        for advice in gpus:
            for i in advice.instances:
                if i.serves and i.serves != "moved":
                    placed[i.serves] += i.replicas
        moved = sum(a.moved_replicas for a in gpus)
        objective = self._objective(solution, sum(placed.values()), moved)
        # Every waiting replica placed, nothing moved: a bound whatever the solver proved.
        trivial = self.w_place * (sum(w.count for w in self.mig) + sum(w.count for w in self.mps))
        upper = min(b for b in (bound, trivial) if b is not None and b >= objective)
        gap = 100.0 * (upper - objective) / abs(upper) if upper else 0.0
        waiting: Counter[str] = Counter()
        for w in self.mig:
            waiting[w.key] += w.count
        for s in self.mps:
            waiting[s.key] += s.count
        return Advice(
            tuple(gpus),
            dict(placed),
            dict(waiting),
            moved,
            objective,
            upper,
            round(max(gap, 0.0), 4),
            status,
            round(elapsed, 3),
            {"placed": self.w_place, "moved": self.w_move, "tidy": self.w_tidy},
        )

    def _objective(self, solution: _Solution, placed: int, moved: int) -> int:
        destroyed = sum(
            1
            for index, g in enumerate(self.gpus)
            for i in g.instances
            if i.replicas == 0 and (index, i.profile_id, i.start) not in solution.chosen
        )
        used = Counter({pid: self.busy[pid] for pid in self.profile_ids})
        for w in self.mig:
            used[w.profile_id] += solution.mig_used.get(w.key, 0)
        for (_, pid), n in solution.mps_instances.items():
            used[pid] += n
        total = Counter(pid for _, pid, _ in solution.chosen)
        spare = sum(max(0, total[pid] - used[pid]) for pid in set(total) | set(used))
        tidy = 2 * destroyed + spare + sum(solution.mps_instances.values())
        return self.w_place * placed - self.w_move * moved - self.w_tidy * tidy

    def _purposes(self, solution: _Solution) -> dict[Position, tuple[str, int, bool]]:
        """Which chosen instance serves what: moved replicas first, then MIG, then MPS."""
        free: dict[int, list[Position]] = {}
        for pos in sorted(solution.chosen):
            index, pid, start = pos
            g = self.gpus[index]
            old = next((i for i in g.instances if (i.profile_id, i.start) == (pid, start)), None)
            if old is not None and old.replicas and index not in solution.drained:
                continue
            free.setdefault(pid, []).append(pos)
        out: dict[Position, tuple[str, int, bool]] = {}
        for index in sorted(solution.drained):
            for moved in (i for i in self.gpus[index].instances if i.replicas):
                if free.get(moved.profile_id):
                    out[free[moved.profile_id].pop(0)] = ("moved", moved.replicas, moved.mps)
        for w in self.mig:
            for _ in range(solution.mig_used.get(w.key, 0)):
                if free.get(w.profile_id):
                    out[free[w.profile_id].pop(0)] = (w.key, 1, False)
        for share in self.mps:
            left = share.count
            for (key, pid), n in sorted(solution.mps_instances.items()):
                if key != share.key:
                    continue
                cap = self.mps_caps[(key, pid)]
                for _ in range(n):
                    if left <= 0 or not free.get(pid):
                        break
                    take = min(cap, left)
                    out[free[pid].pop(0)] = (share.key, take, True)
                    left -= take
        return out


def _profile_size(product: Product | None, profile_id: int) -> int:
    profile = product.profile(profile_id) if product is not None else None
    return profile.memory_slices if profile is not None else 0
