"""The layout advisor's problem: the positions (GPU, profile, start) it may choose, the
objective's weights, the greedy plan that moves nothing, and the answer assembled from a plan
(purposes: which chosen instance serves what)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.mig import Instance, Product, Profile, free_placements
from fleet.mps import MAX_CLIENTS_PER_GPU
from fleet.placement.advisor.values import (
    Advice,
    AdvisorGpu,
    GpuAdvice,
    NewInstance,
    WaitingMig,
    WaitingMps,
)


def mps_instance_capacity(product: Product, profile: Profile, memory_mib: int) -> int:
    """How many MPS clients of ``memory_mib`` one new ``profile`` instance (default policy)
    holds: its memory, and its client slots (48 in proportion to its compute)."""
    if memory_mib < 1 or not product.compute_slice_count:
        return 0
    slots = max(1, MAX_CLIENTS_PER_GPU * profile.compute_slices // product.compute_slice_count)
    return min(profile.memory_mib // memory_mib, slots)


Position = tuple[int, int, int]
"""(GPU index in the input, profile id, start)."""


@dataclass
class Solution:
    """A plan: the instances chosen (by position), the GPUs drained, and how many waiting
    replicas of each deployment it places (MIG), or instances it gives each MPS one."""

    chosen: set[Position]
    drained: set[int]
    mig_used: dict[str, int]
    mps_instances: dict[tuple[str, int], int]


class Problem:
    """The advisor's problem: the GPUs, the waiting replicas and the objective's weights;
    its greedy plan (the solver's hint, or the answer without one) and the answer's assembly
    from a plan (:mod:`fleet.placement.advisor.solver` builds the CP-SAT model on it)."""

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

    def mps_count(self, key: str) -> int:
        return sum(w.count for w in self.mps if w.key == key)

    # -- the greedy plan -------------------------------------------------------------------

    def greedy(self) -> Solution:
        """The best of four plans that move nothing: keep or drop the idle instances, and add
        the waiting replicas first-fit, largest or smallest profiles first."""
        plans = [self._greedy(drop, small) for drop in (False, True) for small in (False, True)]
        return max(plans, key=lambda plan: self._objective(plan, self._placed(plan), 0))

    def _placed(self, plan: Solution) -> int:
        placed = sum(plan.mig_used.values())
        for w in self.mps:
            room = sum(
                self.mps_caps[pair] * n
                for pair, n in plan.mps_instances.items()
                if pair[0] == w.key
            )
            placed += min(w.count, room)
        return placed

    def _greedy(self, drop_idle: bool, smallest_first: bool) -> Solution:
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
        return Solution(chosen, set(), mig_used, mps_instances)

    def _add_first_fit(self, layouts: list[list[Instance]], pid: int) -> bool:
        for index, g in enumerate(self.gpus):
            options = free_placements(g.product, pid, layouts[index])
            if options:
                layouts[index].append(Instance(pid, options[-1].start))
                return True
        return False

    # -- the answer ------------------------------------------------------------------------

    def advice(self, solution: Solution, status: str, bound: int | None, elapsed: float) -> Advice:
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

    def _objective(self, solution: Solution, placed: int, moved: int) -> int:
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

    def _purposes(self, solution: Solution) -> dict[Position, tuple[str, int, bool]]:
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
