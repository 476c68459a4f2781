"""Defragmentation plans: the fewest moves that let a request fit, or that empty whole GPUs.

Pure: plans are computed on a :class:`FleetSnapshot` with :func:`fleet.placement.rank`, so a move
only ever goes where ``rank`` says the allocation fits (never onto an unhealthy or cordoned GPU or
host, never onto busy MIG slices). Sources may be cordoned: draining is what defrag is for.

A move relocates one MIG replica (its partition is destroyed at the source and created, or an
idle partition of the same profile reused, at the destination) or one MPS client. An idle MIG
partition in the way is destroyed, not moved (``to_gpu`` is ``None``). Whole-GPU workloads are
not moved.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Literal

from fleet.mig import Instance
from fleet.placement.fit import DEFAULT_STRATEGY, Strategy, Target, rank
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    MigPartition,
    MigRequest,
    MpsRequest,
    PlacementRequest,
    WholeGpuRequest,
)

DEFAULT_MAX_MOVES = 3
CONSOLIDATION_STRATEGY: Strategy = "best_fit"


@dataclass(frozen=True)
class Move:
    """One step of a plan.

    Attributes:
        kind: ``mig`` (a partition), ``mps`` (a client reservation) or ``gpu`` (a whole-GPU
            replica; only repack plans move these, :mod:`fleet.placement.repack`).
        allocation_id: the MIG partition id, the MPS reservation's id (its index when the
            snapshot has no ``mps_reservation_ids``), or the whole GPU's partition id.
        from_gpu: where it is now.
        to_gpu: where it goes; ``None`` destroys an idle MIG partition.
        to_partition_id: an existing idle partition at the destination that it takes over.
        new_instance: the MIG instance to create at the destination.
        occupied: whether a workload moves (``False`` for an idle partition).
    """

    kind: Literal["mig", "mps", "gpu"]
    allocation_id: int
    from_gpu: int
    to_gpu: int | None
    to_partition_id: int | None = None
    new_instance: Instance | None = None
    occupied: bool = True


@dataclass(frozen=True)
class MovePlan:
    """Moves, in order, and where the request fits after them (``None``: no plan found)."""

    moves: tuple[Move, ...]
    target: Target | None
    snapshot: FleetSnapshot

    @property
    def fits(self) -> bool:
        """Whether the request fits after the moves."""
        return self.target is not None


@dataclass(frozen=True)
class FreePlan:
    """Moves that empty ``freed`` GPUs (fewer than asked when no more can be emptied)."""

    moves: tuple[Move, ...]
    freed: tuple[int, ...]
    snapshot: FleetSnapshot


@dataclass(frozen=True)
class _Allocation:
    kind: Literal["mig", "mps"]
    allocation_id: int
    occupied: bool
    request: PlacementRequest
    partition: MigPartition | None = None
    index: int = 0


def plan_moves(
    snapshot: FleetSnapshot,
    request: PlacementRequest,
    *,
    max_moves: int = DEFAULT_MAX_MOVES,
    strategy: Strategy = DEFAULT_STRATEGY,
    demand: Demand | None = None,
    requests: Mapping[tuple[str, int], PlacementRequest] | None = None,
    demands: Mapping[tuple[str, int], Demand] | None = None,
    movable: Collection[tuple[str, int]] | None = None,
) -> MovePlan:
    """The fewest moves (at most ``max_moves``) after which ``request`` fits somewhere.

    Tries every set of allocations on one GPU the request could use, smallest sets first; a set
    works when the request fits on that GPU without them and each can be placed elsewhere in
    turn. Among the smallest working sets, the fewest workload moves win, then snapshot order.
    ``demand`` applies to ``request``; ``demands``: what each replica moved out of its way
    needs beside its share, by ``(kind, allocation_id)`` (default: none);
    ``requests``: the moved replicas' requests as their deployments declare them, by
    ``(kind, allocation_id)`` (default: the MIG profile id each holds, which names another
    profile on another product); ``movable``: the only replicas that may move, by the same
    key (default: any; idle partitions may always go).

    Returns:
        The plan; no moves when the request fits already, ``target`` ``None`` when no plan of at
        most ``max_moves`` moves exists (and always for whole-GPU requests that do not fit).
    """
    best = rank(snapshot, request, strategy=strategy, demand=demand).best
    if best is not None or isinstance(request, WholeGpuRequest):
        return MovePlan((), best, snapshot)
    sources = [g for g in snapshot.gpus if _could_host(snapshot, g, request, demand)]
    for size in range(1, max_moves + 1):
        found: list[tuple[int, int, MovePlan]] = []
        for order, gpu in enumerate(sources):
            plan = _first_plan(
                snapshot, gpu, request, size, strategy, demand, requests, demands, movable
            )
            if plan is not None:
                workload = sum(1 for m in plan.moves if m.occupied)
                found.append((workload, order, plan))
        if found:
            return min(found, key=lambda item: item[:2])[2]
    return MovePlan((), None, snapshot)


def plan_free_gpus(
    snapshot: FleetSnapshot,
    count: int,
    *,
    strategy: Strategy = CONSOLIDATION_STRATEGY,
    sources: Collection[int] | None = None,
    demands: Mapping[tuple[str, int], Demand] | None = None,
    requests: Mapping[tuple[str, int], PlacementRequest] | None = None,
) -> FreePlan:
    """Moves that empty ``count`` GPUs holding MIG or MPS allocations, fewest moves first.

    Greedy: the GPU with the fewest allocations that can be fully evacuated onto GPUs already in
    use (emptying one GPU by filling another gains nothing) goes first; a GPU that received moves
    is not emptied later (nothing moves twice). Moves go where ``strategy`` ranks best: by
    default ``best_fit``, the fullest GPU, since the plan's aim is to consolidate (the product
    strategy keeps room for the request mix instead, which can spread the moves).

    ``sources``: the GPUs that may be emptied (default: any); ``demands``: what each replica
    needs beside its share, by ``(kind, allocation_id)`` as in :class:`Move` (default: none);
    ``requests``: each replica's request as its deployment declares it (default: the MIG
    profile id it holds, which names another profile on another product).
    """
    moves: list[Move] = []
    freed: list[int] = []
    current = snapshot
    while len(freed) < count:
        received = {m.to_gpu for m in moves if m.to_gpu is not None}
        emptied = _cheapest_evacuation(
            current, received, strategy, sources, demands or {}, requests or {}
        )
        if emptied is None:
            break
        gpu_id, more, current = emptied
        moves.extend(more)
        freed.append(gpu_id)
    return FreePlan(tuple(moves), tuple(freed), current)


def _cheapest_evacuation(
    snapshot: FleetSnapshot,
    received: set[int],
    strategy: Strategy,
    sources: Collection[int] | None,
    demands: Mapping[tuple[str, int], Demand],
    requests: Mapping[tuple[str, int], PlacementRequest],
) -> tuple[int, list[Move], FleetSnapshot] | None:
    busy = [
        g
        for g in snapshot.gpus
        if _allocations(g) and g.id not in received and (sources is None or g.id in sources)
    ]
    for gpu in sorted(busy, key=lambda g: len(_allocations(g))):
        keep_out = {g.id for g in snapshot.gpus if not _allocations(g)} | {gpu.id}
        evacuated = _evacuate(
            snapshot, gpu.id, _allocations(gpu), keep_out, strategy, demands, requests
        )
        if evacuated is not None:
            return gpu.id, *evacuated
    return None


def _could_host(
    snapshot: FleetSnapshot, gpu: GpuState, request: PlacementRequest, demand: Demand | None
) -> bool:
    """Whether ``request`` would fit on ``gpu`` were it empty (and it has something to move)."""
    if not _allocations(gpu):
        return False
    empty = replace(gpu, partitions=(), mps_reservations=(), mps_reservation_ids=())
    alone = FleetSnapshot(snapshot.hosts, (empty,))
    return rank(alone, request, demand=demand).best is not None


def _first_plan(
    snapshot: FleetSnapshot,
    gpu: GpuState,
    request: PlacementRequest,
    size: int,
    strategy: Strategy,
    demand: Demand | None,
    requests: Mapping[tuple[str, int], PlacementRequest] | None = None,
    demands: Mapping[tuple[str, int], Demand] | None = None,
    movable: Collection[tuple[str, int]] | None = None,
) -> MovePlan | None:
    allocations = [
        a
        for a in _allocations(gpu)
        if movable is None or not a.occupied or (a.kind, a.allocation_id) in movable
    ]
    # Idle partitions first: among sets of one size, the first to work moves the fewest workloads.
    allocations.sort(key=lambda a: a.occupied)
    for chosen in combinations(allocations, size):
        without = _without(gpu, chosen)
        alone = FleetSnapshot(snapshot.hosts, (without,))
        if rank(alone, request, strategy=strategy, demand=demand).best is None:
            continue
        evacuated = _evacuate(snapshot, gpu.id, list(chosen), {gpu.id}, strategy, demands, requests)
        if evacuated is None:
            continue
        moves, after = evacuated
        target = rank(after, request, strategy=strategy, demand=demand).best
        if target is not None:
            return MovePlan(tuple(moves), target, after)
    return None


def _evacuate(
    snapshot: FleetSnapshot,
    gpu_id: int,
    chosen: list[_Allocation],
    keep_out: set[int],
    strategy: Strategy,
    demands: Mapping[tuple[str, int], Demand] | None = None,
    requests: Mapping[tuple[str, int], PlacementRequest] | None = None,
) -> tuple[list[Move], FleetSnapshot] | None:
    """Move ``chosen`` off ``gpu_id`` one by one, never onto ``keep_out``; ``None`` if stuck."""
    current = _replace_gpu(snapshot, _without(_gpu(snapshot, gpu_id), chosen))
    moves: list[Move] = []
    for allocation in chosen:
        if not allocation.occupied:
            moves.append(Move("mig", allocation.allocation_id, gpu_id, None, occupied=False))
            continue
        key = (allocation.kind, allocation.allocation_id)
        demand = (demands or {}).get(key)
        request = (requests or {}).get(key, allocation.request)
        ranking = rank(current, request, strategy=strategy, demand=demand)
        target = next((t for t in ranking.feasible if t.gpu_id not in keep_out), None)
        if target is None:
            return None
        moves.append(
            Move(
                allocation.kind,
                allocation.allocation_id,
                gpu_id,
                target.gpu_id,
                target.partition_id,
                target.new_instance,
            )
        )
        current = _replace_gpu(current, _arrive(_gpu(current, target.gpu_id), allocation, target))
    return moves, current


def _allocations(gpu: GpuState) -> list[_Allocation]:
    found = [
        _Allocation("mig", p.id, p.occupied, MigRequest(p.profile_id), p)
        for p in gpu.partitions
        if gpu.mode == "mig"
    ]
    if gpu.mode == "mps":
        ids = gpu.mps_reservation_ids or tuple(range(len(gpu.mps_reservations)))
        found += [
            _Allocation("mps", ids[k], True, r, None, k) for k, r in enumerate(gpu.mps_reservations)
        ]
    return found


def _without(gpu: GpuState, chosen: tuple[_Allocation, ...] | list[_Allocation]) -> GpuState:
    partitions = {a.partition.id for a in chosen if a.partition is not None}
    clients = {a.index for a in chosen if a.kind == "mps"}
    ids = gpu.mps_reservation_ids
    return replace(
        gpu,
        partitions=tuple(p for p in gpu.partitions if p.id not in partitions),
        mps_reservations=tuple(r for k, r in enumerate(gpu.mps_reservations) if k not in clients),
        mps_reservation_ids=tuple(i for k, i in enumerate(ids) if k not in clients),
    )


def _arrive(gpu: GpuState, allocation: _Allocation, target: Target) -> GpuState:
    if isinstance(allocation.request, MpsRequest):
        ids = (
            (*gpu.mps_reservation_ids, allocation.allocation_id) if gpu.mps_reservation_ids else ()
        )
        return replace(
            gpu,
            mps_reservations=(*gpu.mps_reservations, allocation.request),
            mps_reservation_ids=ids,
        )
    assert allocation.partition is not None
    moved = allocation.partition
    if target.partition_id is not None:
        partitions = tuple(
            replace(p, occupied=True, allocation_id=moved.allocation_id)
            if p.id == target.partition_id
            else p
            for p in gpu.partitions
        )
        return replace(gpu, partitions=partitions)
    assert target.new_instance is not None
    # The planned partition keeps the moved one's id: the source partition no longer exists.
    new = MigPartition(
        moved.id,
        target.new_instance.profile_id,
        target.new_instance.start,
        True,
        moved.allocation_id,
    )
    return replace(gpu, partitions=(*gpu.partitions, new))


def _gpu(snapshot: FleetSnapshot, gpu_id: int) -> GpuState:
    return next(g for g in snapshot.gpus if g.id == gpu_id)


def _replace_gpu(snapshot: FleetSnapshot, gpu: GpuState) -> FleetSnapshot:
    return replace(snapshot, gpus=tuple(gpu if g.id == gpu.id else g for g in snapshot.gpus))
