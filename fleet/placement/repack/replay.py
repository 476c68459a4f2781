"""A solution replayed move by move with :func:`fleet.placement.check` on the snapshot, with the
MIG starts it names (an idle instance reused first), so an applied plan keeps every rule."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from fleet.domain import Violation
from fleet.mig import Instance, suggest_layout
from fleet.placement import migfit
from fleet.placement.defrag import Move
from fleet.placement.fit import check
from fleet.placement.ranking import Target
from fleet.placement.repack.values import Replica, ReplicaKey, Solved
from fleet.placement.simulate import apply_target
from fleet.placement.snapshot import (
    FleetSnapshot,
    GpuState,
    MigRequest,
    PlacementRequest,
)


def mig_places(
    snapshot: FleetSnapshot, replicas: dict[int, list[Replica]], solved: Solved
) -> dict[ReplicaKey, tuple[int | None, int | None]] | None:
    """For each MIG arrival: the idle partition it takes, or the start of its new instance."""
    arriving: dict[int, list[Replica]] = defaultdict(list)
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
        new: list[Replica] = []
        ids = {r.key: mig_profile_id(gpu, r.request) for r in group}
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


def replay_step(
    snapshot: FleetSnapshot,
    replica: Replica,
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


def mig_profile_id(gpu: GpuState, request: PlacementRequest) -> int | None:
    """The id, on ``gpu``'s product, of the profile a MIG request names (``None``: not MIG, or
    a profile the product lacks)."""
    if not isinstance(request, MigRequest):
        return None
    found = migfit.profile_on(gpu, request.profile)
    return None if isinstance(found, Violation) else found[1].id


def _without(gpu: GpuState, replica: Replica) -> GpuState:
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
