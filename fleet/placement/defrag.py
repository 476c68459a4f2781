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
from typing import Any, Literal

from fleet.mig import Instance
from fleet.placement import mixfit
from fleet.placement.fit import DEFAULT_STRATEGY, Strategy, Target, rank
from fleet.placement.options import request_key
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


class _Ranker:
    """Where a request goes on snapshots that differ from ``base`` on a few hosts, exactly as
    :func:`rank` would say, without ranking the fleet again for each planned move.

    For the product strategy the base's ranked items are built once per request; the best
    target on a changed snapshot is the better of the first base item off the changed hosts and
    the best item of the changed hosts, ranked alone (a host's items depend on that host
    alone). Other strategies rank the whole snapshot.
    """

    def __init__(self, base: FleetSnapshot, strategy: Strategy) -> None:
        self.base = base
        self.strategy = strategy
        self._items: dict[tuple[Any, ...], list[mixfit.Item]] = {}

    def first(
        self,
        current: FleetSnapshot,
        changed: Collection[int],
        request: PlacementRequest,
        demand: Demand | None,
        keep_out: Collection[int] = (),
    ) -> Target | None:
        """The first target of ``rank(current, request).feasible`` not on ``keep_out``;
        ``changed``: the hosts on which ``current`` differs from the base."""
        if self.strategy != "product":
            ranking = rank(current, request, strategy=self.strategy, demand=demand)
            best = ranking.best
            if best is None or best.gpu_id not in keep_out:
                return best
            return next((t for t in ranking.feasible if t.gpu_id not in keep_out), None)
        key = (request_key(request), mixfit.demand_key(demand))
        items = self._items.get(key)
        if items is None:
            items = self._items[key] = mixfit.ranked_items(self.base, request, None, demand)
        hosts = set(changed)
        candidates = []
        for item in items:
            gpu = self.base.gpu(item[3])
            if item[3] not in keep_out and gpu is not None and gpu.host_id not in hosts:
                candidates.append(item)
                break
        for item in mixfit.ranked_items(current, request, None, demand, hosts):
            if item[3] not in keep_out:
                candidates.append(item)
                break
        if not candidates:
            return None
        return mixfit.item_target(min(candidates, key=mixfit.item_order))


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
    ranker = _Ranker(snapshot, strategy)
    for size in range(1, max_moves + 1):
        found: list[tuple[int, int, MovePlan]] = []
        for order, gpu in enumerate(sources):
            plan = _first_plan(ranker, gpu, request, size, demand, requests, demands, movable)
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
    ranker = _Ranker(snapshot, strategy)
    changed: set[int] = set()
    while len(freed) < count:
        received = {m.to_gpu for m in moves if m.to_gpu is not None}
        emptied = _cheapest_evacuation(
            ranker, current, changed, received, sources, demands or {}, requests or {}
        )
        if emptied is None:
            break
        gpu_id, more, current, changed = emptied
        moves.extend(more)
        freed.append(gpu_id)
    return FreePlan(tuple(moves), tuple(freed), current)


def _cheapest_evacuation(
    ranker: _Ranker,
    snapshot: FleetSnapshot,
    changed: set[int],
    received: set[int],
    sources: Collection[int] | None,
    demands: Mapping[tuple[str, int], Demand],
    requests: Mapping[tuple[str, int], PlacementRequest],
) -> tuple[int, list[Move], FleetSnapshot, set[int]] | None:
    busy = [
        g
        for g in snapshot.gpus
        if _allocations(g) and g.id not in received and (sources is None or g.id in sources)
    ]
    empty = {g.id for g in snapshot.gpus if not _allocations(g)}
    for gpu in sorted(busy, key=lambda g: len(_allocations(g))):
        evacuated = _evacuate(
            ranker,
            snapshot,
            gpu.id,
            _allocations(gpu),
            empty | {gpu.id},
            demands,
            requests,
            changed,
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
    return rank(_alone(snapshot, empty), request, demand=demand).best is not None


def _alone(snapshot: FleetSnapshot, gpu: GpuState) -> FleetSnapshot:
    """A snapshot of ``gpu`` alone, with its host (what ``rank`` needs to judge it)."""
    host = snapshot.host(gpu.host_id)
    return FleetSnapshot(() if host is None else (host,), (gpu,))


def _first_plan(
    ranker: _Ranker,
    gpu: GpuState,
    request: PlacementRequest,
    size: int,
    demand: Demand | None,
    requests: Mapping[tuple[str, int], PlacementRequest] | None = None,
    demands: Mapping[tuple[str, int], Demand] | None = None,
    movable: Collection[tuple[str, int]] | None = None,
) -> MovePlan | None:
    snapshot, strategy = ranker.base, ranker.strategy
    allocations = [
        a
        for a in _allocations(gpu)
        if movable is None or not a.occupied or (a.kind, a.allocation_id) in movable
    ]
    # Idle partitions first: among sets of one size, the first to work moves the fewest workloads.
    allocations.sort(key=lambda a: a.occupied)
    for chosen in combinations(allocations, size):
        without = _without(gpu, chosen)
        alone = _alone(snapshot, without)
        if rank(alone, request, strategy=strategy, demand=demand).best is None:
            continue
        evacuated = _evacuate(ranker, snapshot, gpu.id, list(chosen), {gpu.id}, demands, requests)
        if evacuated is None:
            continue
        moves, after, changed = evacuated
        target = ranker.first(after, changed, request, demand)
        if target is not None:
            return MovePlan(tuple(moves), target, after)
    return None


def _evacuate(
    ranker: _Ranker,
    snapshot: FleetSnapshot,
    gpu_id: int,
    chosen: list[_Allocation],
    keep_out: set[int],
    demands: Mapping[tuple[str, int], Demand] | None = None,
    requests: Mapping[tuple[str, int], PlacementRequest] | None = None,
    changed: Collection[int] = (),
) -> tuple[list[Move], FleetSnapshot, set[int]] | None:
    """Move ``chosen`` off ``gpu_id`` one by one, never onto ``keep_out``; ``None`` if stuck.
    ``snapshot`` differs from the ranker's base on the hosts ``changed``; returns the moves,
    the snapshot after them, and the hosts it differs on from the base then."""
    source = _gpu(snapshot, gpu_id)
    current = _replace_gpu(snapshot, _without(source, chosen))
    hosts = {*changed, source.host_id}
    moves: list[Move] = []
    for allocation in chosen:
        if not allocation.occupied:
            moves.append(Move("mig", allocation.allocation_id, gpu_id, None, occupied=False))
            continue
        key = (allocation.kind, allocation.allocation_id)
        demand = (demands or {}).get(key)
        request = (requests or {}).get(key, allocation.request)
        target = ranker.first(current, hosts, request, demand, keep_out)
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
        arrived = _arrive(_gpu(current, target.gpu_id), allocation, target)
        current = _replace_gpu(current, arrived)
        hosts.add(arrived.host_id)
    return moves, current, hosts


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
    found = snapshot.gpu(gpu_id)
    if found is None:
        raise KeyError(f"GPU {gpu_id} is not in the snapshot")
    return found


def _replace_gpu(snapshot: FleetSnapshot, gpu: GpuState) -> FleetSnapshot:
    # with_changes keeps the other hosts' groups and their memos: the ranking after a planned
    # move pays for the host that changed, not for the fleet.
    return snapshot.with_changes(gpus=[gpu])
