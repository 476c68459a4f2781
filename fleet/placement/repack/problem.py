"""A repack problem for one product: the candidates (GPUs holding replicas that can all move)
and their replicas, where each replica could land alone, the greedy plan, and the answer (a
solution checked by replay, against the greedy plan and the bound)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from fleet.mps import MpsRequest
from fleet.placement.defrag import Move, plan_free_gpus
from fleet.placement.fit import check
from fleet.placement.ranking import Target
from fleet.placement.repack.replay import mig_places, replay_step
from fleet.placement.repack.values import (
    SOLVER_STATUSES,
    RepackPlan,
    Replica,
    ReplicaKey,
    Solved,
)
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    MigRequest,
    PlacementRequest,
    WholeGpuRequest,
)


class Problem:
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
        self.replicas: dict[int, list[Replica]] = {}
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

    def _lands(self, replica: Replica, target: GpuState, seen: dict[int, bool]) -> bool:
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
        method = "cp-sat" if status in SOLVER_STATUSES else "greedy"
        return self.plan(count, status=status, reason=reason, method=method, bound=0)

    def decide(
        self,
        count: int,
        greedy: tuple[tuple[Move, ...], tuple[int, ...], FleetSnapshot],
        solved: Solved,
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

    def realise(self, solved: Solved) -> tuple[tuple[Move, ...], FleetSnapshot] | None:
        """The moves of a solution, replayed with :func:`check` (``None``: a rule refused)."""
        where = mig_places(self.snapshot, self.replicas, solved)
        if where is None:
            return None
        current = self.snapshot
        moves: list[Move] = []
        for gpu_id in solved.emptied:
            for replica in self.replicas[gpu_id]:
                step = replay_step(current, replica, solved.landing.get(replica.key), where)
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
) -> list[Replica]:
    if gpu.mode == "dedicated":
        assert gpu.whole_partition_id is not None
        key = ("gpu", gpu.whole_partition_id)
        return [Replica(key, gpu.id, WholeGpuRequest(1), demands.get(key))]
    if gpu.mode == "mps":
        ids = gpu.mps_reservation_ids or tuple(range(len(gpu.mps_reservations)))
        return [
            Replica(("mps", i), gpu.id, r, demands.get(("mps", i)))
            for i, r in zip(ids, gpu.mps_reservations, strict=True)
        ]
    return [
        Replica(
            ("mig", p.id),
            gpu.id,
            requests.get(("mig", p.id), MigRequest(p.profile_id)),
            demands.get(("mig", p.id)),
            p.occupied,
        )
        for p in gpu.partitions
    ]
