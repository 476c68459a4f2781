"""The reclaim plan: how a team gets its deserved share back from borrowers, least harm first.

Stdlib only; ``now`` is passed in. For one claimant replica (a team within its deserved share,
waiting), in this order:

1. **place** it without touching anyone, if it fits;
2. **move** borrowed replicas out of its way (make-before-break moves: the borrower keeps its
   running replicas), the fewest moves first (:func:`fleet.placement.defrag.plan_moves`
   restricted to borrowed replicas); where moving borrowed replicas alone makes no room (and
   something is borrowed), the fewest moves of *any* replicas: a move costs nobody a running
   replica, a stop does, so no borrowed replica is stopped while free capacity that moves
   could open remains;
3. only then **stop** borrowed replicas: on one host, the lowest priority first and, within a
   priority, the most recently started first, never one younger than ``min_runtime_s``; the
   host needing the fewest stops wins. Where stops alone do not do it either (a whole-GPU
   claimant, say, on GPUs that each also hold a guaranteed replica): on one GPU, its borrowed
   replicas stop and its other replicas (at most ``max_moves``) move elsewhere first.

The whole plan is simulated first: when even stopping every eligible borrowed replica would not
place the claimant, the plan is ``none`` and nothing is touched (no eviction without a net gain).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from fleet.placement.defrag import DEFAULT_MAX_MOVES, Move, plan_moves
from fleet.placement.fit import Target, rank
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    PlacementRequest,
    WholeGpuRequest,
)

Action = Literal["place", "move", "stop", "none"]


@dataclass(frozen=True)
class Borrowed:
    """A borrowed replica that a reclaim may move or stop.

    Attributes:
        key: ``("mig", partition id)``, ``("mps", allocation id)`` or ``("gpu", gpu id)``, as
            :class:`fleet.placement.defrag.Move` names what it moves.
        gpu_id: the GPU it holds.
        priority: its priority value (the lower goes first).
        started_s: when it started (the same clock as ``now_s``).
    """

    key: tuple[str, int]
    gpu_id: int
    priority: int
    started_s: float


@dataclass(frozen=True)
class ReclaimPlan:
    """What to do for the claimant: ``place`` it at ``target`` now, ``move`` (``moves`` then
    place at ``target``), ``stop`` (``stops`` then place at ``target``), or ``none``."""

    action: Action
    target: Target | None = None
    moves: tuple[Move, ...] = ()
    stops: tuple[Borrowed, ...] = ()
    reason: str = ""


def plan_gpus(plan: ReclaimPlan) -> frozenset[int]:
    """Every GPU the plan touches: its moves' sources and destinations, the GPUs of the
    replicas it stops, and where the claimant goes. Reclaims that run at once touch disjoint
    sets (:mod:`fleet.sharing.reclaiming`), so none counts on capacity another frees."""
    gpus = {m.from_gpu for m in plan.moves}
    gpus |= {m.to_gpu for m in plan.moves if m.to_gpu is not None}
    gpus |= {b.gpu_id for b in plan.stops}
    if plan.target is not None:
        gpus |= {plan.target.gpu_id, *plan.target.gpu_ids}
    return frozenset(gpus)


def _without(gpu: GpuState, key: tuple[str, int]) -> GpuState:
    kind, ident = key
    if kind == "gpu":
        return replace(gpu, taken=False)
    if kind == "mig":
        return replace(gpu, partitions=tuple(p for p in gpu.partitions if p.id != ident))
    ids = gpu.mps_reservation_ids or tuple(range(len(gpu.mps_reservations)))
    keep = [k for k, i in enumerate(ids) if i != ident]
    return replace(
        gpu,
        mps_reservations=tuple(gpu.mps_reservations[k] for k in keep),
        mps_reservation_ids=tuple(ids[k] for k in keep) if gpu.mps_reservation_ids else (),
    )


def _stopped(snapshot: FleetSnapshot, stops: Sequence[Borrowed]) -> FleetSnapshot:
    gpus: dict[int, GpuState] = {}
    for b in stops:
        found = gpus.get(b.gpu_id) or snapshot.gpu(b.gpu_id)
        if found is not None:
            gpus[b.gpu_id] = _without(found, b.key)
    return snapshot.with_changes(gpus=gpus.values())


def stop_order(
    borrowed: Collection[Borrowed], now_s: float, min_runtime_s: float
) -> list[Borrowed]:
    """The borrowed replicas that may be stopped, in the order they are: the lowest priority
    first, then the most recently started; none younger than ``min_runtime_s``."""
    eligible = [b for b in borrowed if now_s - b.started_s >= min_runtime_s]
    return sorted(eligible, key=lambda b: (b.priority, -b.started_s, b.key))


def _stops_on_host(
    snapshot: FleetSnapshot,
    request: PlacementRequest,
    demand: Demand | None,
    ordered: list[Borrowed],
) -> tuple[tuple[Borrowed, ...], Target] | None:
    """The fewest of ``ordered`` (one host's, in stop order) whose stop places the claimant."""
    for n in range(1, len(ordered) + 1):
        best = rank(_stopped(snapshot, ordered[:n]), request, demand=demand).best
        if best is not None:
            return tuple(ordered[:n]), best
    return None


COMBINED_CANDIDATES = 8
"""GPUs a plan of stops and moves is tried on, at most (each try runs the move planner)."""


def _occupants(gpu: GpuState) -> list[tuple[str, int]] | None:
    """The replicas on ``gpu`` by planner key; ``None`` for a whole-GPU one (never moved)."""
    if gpu.taken:
        return None
    if gpu.mode == "mps":
        ids = gpu.mps_reservation_ids or tuple(range(len(gpu.mps_reservations)))
        return [("mps", i) for i in ids]
    return [("mig", p.id) for p in gpu.partitions if p.occupied]


def _stops_and_moves(
    snapshot: FleetSnapshot,
    request: PlacementRequest,
    by_host: Mapping[int, list[Borrowed]],
    demand: Demand | None,
    requests: Mapping[tuple[str, int], PlacementRequest] | None,
    demands: Mapping[tuple[str, int], Demand] | None,
    max_moves: int,
) -> ReclaimPlan | None:
    """Stops and moves together, where neither alone places the claimant: on one GPU, its
    borrowed replicas that may be stopped stop and its other replicas (at most ``max_moves``,
    a borrowed one too young to stop among them) move elsewhere, make-before-break. The GPUs
    needing the fewest stops, then the fewest moves, are tried first."""
    candidates = []
    for ordered in by_host.values():
        on_gpu: dict[int, list[Borrowed]] = {}
        for b in ordered:
            on_gpu.setdefault(b.gpu_id, []).append(b)
        for gpu_id, stops in on_gpu.items():
            gpu = snapshot.gpu(gpu_id)
            occupants = None if gpu is None else _occupants(gpu)
            if occupants is None:
                continue
            keys = {b.key for b in stops}
            others = [k for k in occupants if k not in keys]
            if 0 < len(others) <= max_moves:
                candidates.append((len(stops), len(others), gpu_id, tuple(stops), others))
    candidates.sort(key=lambda c: c[:3])
    for _, _, _, stopping, others in candidates[:COMBINED_CANDIDATES]:
        moved = plan_moves(
            _stopped(snapshot, stopping),
            request,
            max_moves=max_moves,
            demand=demand,
            requests=requests,
            demands=demands,
            movable=set(others),
        )
        if moved.target is not None:
            return ReclaimPlan("stop", moved.target, moved.moves, stopping)
    return None


def reclaim_plan(
    snapshot: FleetSnapshot,
    request: PlacementRequest,
    *,
    borrowed: Collection[Borrowed],
    now_s: float,
    min_runtime_s: float,
    demand: Demand | None = None,
    requests: Mapping[tuple[str, int], PlacementRequest] | None = None,
    demands: Mapping[tuple[str, int], Demand] | None = None,
    max_moves: int = DEFAULT_MAX_MOVES,
) -> ReclaimPlan:
    """The least harmful plan that places the claimant (``request``), simulated whole.

    Args:
        borrowed: the borrowed replicas of other teams that a reclaim may touch.
        requests, demands: the borrowed replicas' own requests and demands, by key (as
            :func:`plan_moves` takes them).
    """
    best = rank(snapshot, request, demand=demand).best
    if best is not None:
        return ReclaimPlan("place", best)
    keys = {b.key for b in borrowed}
    if keys and not isinstance(request, WholeGpuRequest):
        for movable in (keys, None):  # borrowed replicas first, then any replica
            moved = plan_moves(
                snapshot,
                request,
                max_moves=max_moves,
                demand=demand,
                requests=requests,
                demands=demands,
                movable=movable,
            )
            if moved.target is not None:
                return ReclaimPlan("move", moved.target, moved.moves)
    by_host: dict[int, list[Borrowed]] = {}
    for b in stop_order(borrowed, now_s, min_runtime_s):
        gpu = snapshot.gpu(b.gpu_id)
        if gpu is not None:
            by_host.setdefault(gpu.host_id, []).append(b)
    found = [
        plan
        for ordered in by_host.values()
        if (plan := _stops_on_host(snapshot, request, demand, ordered)) is not None
    ]
    if found:
        stops, target = min(
            found, key=lambda p: (len(p[0]), [(b.priority, -b.started_s) for b in p[0]])
        )
        return ReclaimPlan("stop", target, stops=stops)
    combined = _stops_and_moves(snapshot, request, by_host, demand, requests, demands, max_moves)
    if combined is not None:
        return combined
    return ReclaimPlan(
        "none",
        reason="No net gain: even stopping every borrowed replica that may be stopped would "
        "not place it; nothing is touched.",
    )
