"""Reads for placement: the fleet snapshot the engine ranks, and the ranking of one deployment.

The snapshot is a read without locks; the place service re-checks every choice under row locks.
"""

from __future__ import annotations

from collections import defaultdict

from fleet.allocations.models import Allocation, Deployment, RequestKind
from fleet.inventory.models import Gpu, GpuHealth, Host, HostStatus, SharingMode
from fleet.mps import MpsRequest, client_environment
from fleet.partitioning.models import Partition, PartitionKind
from fleet.placement import (
    FleetSnapshot,
    GpuState,
    HostState,
    MigPartition,
    MigRequest,
    MovePlan,
    PlacementRequest,
    Ranking,
    WholeGpuRequest,
    plan_moves,
    rank,
)

UNAVAILABLE_HOST_STATUSES = (HostStatus.CORDONED, HostStatus.DRAINING, HostStatus.UNHEALTHY)


def fleet_snapshot() -> FleetSnapshot:
    """Every host and GPU with its partitions and reservations, in a stable order."""
    hosts = tuple(
        HostState(
            id=host.pk,
            healthy=host.status not in (HostStatus.UNHEALTHY, HostStatus.OFFLINE),
            cordoned=host.status in (HostStatus.CORDONED, HostStatus.DRAINING),
        )
        for host in Host.objects.order_by("name")
    )
    partitions: dict[int, list[Partition]] = defaultdict(list)
    for partition in Partition.objects.order_by("gpu_id", "start"):
        partitions[partition.gpu_id].append(partition)
    allocations: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in Allocation.objects.only(
        "pk", "partition_id", "kind", "memory_mib", "compute_percent"
    ).order_by("pk"):
        allocations[allocation.partition_id].append(allocation)
    gpus = tuple(
        _gpu_state(gpu, partitions[gpu.pk], allocations)
        for gpu in Gpu.objects.select_related("host").order_by("host__name", "index")
    )
    return FleetSnapshot(hosts=hosts, gpus=gpus)


def _gpu_state(
    gpu: Gpu, parts: list[Partition], allocations: dict[int, list[Allocation]]
) -> GpuState:
    whole = next((p for p in parts if p.kind == PartitionKind.GPU), None)
    whole_allocations = allocations.get(whole.pk, []) if whole is not None else []
    mps_clients = (
        [a for a in whole_allocations if a.kind == RequestKind.MPS]
        if gpu.mode == SharingMode.MPS
        else []
    )
    return GpuState(
        id=gpu.pk,
        host_id=gpu.host_id,
        product_key=gpu.product_key or None,
        memory_mib=gpu.memory_mib,
        mode=gpu.mode,  # type: ignore[arg-type]
        healthy=gpu.health not in (GpuHealth.UNHEALTHY, GpuHealth.LOST),
        cordoned=gpu.cordoned,
        taken=gpu.mode == SharingMode.DEDICATED and (whole is None or bool(whole_allocations)),
        partitions=tuple(
            MigPartition(
                p.pk,
                int(p.profile_id or 0),
                p.start,
                occupied=bool(allocations.get(p.pk)),
                allocation_id=allocations[p.pk][0].pk if allocations.get(p.pk) else None,
            )
            for p in parts
            if p.kind == PartitionKind.MIG
        ),
        mps_reservations=tuple(MpsRequest(a.memory_mib, a.compute_percent) for a in mps_clients),
        mps_reservation_ids=tuple(a.pk for a in mps_clients),
        mps_max_clients=whole.mps_max_clients if whole is not None else None,
    )


def placement_request(deployment: Deployment) -> PlacementRequest:
    if deployment.kind == RequestKind.MIG:
        return MigRequest(deployment.profile)
    if deployment.kind == RequestKind.MPS:
        return MpsRequest(int(deployment.memory_mib or 0), deployment.max_compute_percent)
    return WholeGpuRequest(int(deployment.gpu_count or 1))


def deployment_ranking(deployment: Deployment, snapshot: FleetSnapshot | None = None) -> Ranking:
    """Every target of the deployment's next replica, best first (the default strategy), with
    the reason for every target that does not fit: the API, the drag preview and auto-placement
    all read this."""
    return rank(snapshot or fleet_snapshot(), placement_request(deployment))


def allocation_environment(allocation: Allocation) -> dict[str, str]:
    """What a replica's process needs to run where it was placed.

    ``CUDA_VISIBLE_DEVICES`` names the MIG instance (its ``MIG-`` UUID once the agent created
    it) or the GPU; an MPS share adds ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``,
    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (when capped) and the daemon's
    ``CUDA_MPS_PIPE_DIRECTORY`` as the agent reported it. Empty until the device exists.
    """
    partition, gpu = allocation.partition, allocation.gpu
    device = partition.uuid if partition.kind == PartitionKind.MIG else gpu.uuid
    if not device:
        return {}
    env = {"CUDA_VISIBLE_DEVICES": device}
    if allocation.kind == RequestKind.MPS:
        env.update(
            client_environment(
                MpsRequest(allocation.memory_mib, allocation.compute_percent),
                device=device,
                pipe_directory=_pipe_directory(gpu, device),
            )
        )
    return env


def _pipe_directory(gpu: Gpu, target_uuid: str) -> str | None:
    """The MPS pipe directory the agent reported for the daemon serving ``target_uuid``."""
    mps = gpu.observed.get("mps") if isinstance(gpu.observed, dict) else None
    if not isinstance(mps, dict):
        return None
    daemons = [mps, *mps.get("instances", [])]
    for daemon in daemons:
        if daemon.get("target_uuid", gpu.uuid) == target_uuid and daemon.get("pipe_directory"):
            return str(daemon["pipe_directory"])
    return None


def deployment_defrag_plan(deployment: Deployment) -> MovePlan:
    """The fewest moves of other replicas that would let the next replica fit (a proposal)."""
    return plan_moves(fleet_snapshot(), placement_request(deployment))
