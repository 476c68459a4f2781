"""What a replica's process sees where it was placed: the CUDA device it may use and, for an MPS
share, the MPS client variables (what the API shows of a replica).
"""

from __future__ import annotations

from fleet.allocations.models import Allocation, RequestKind
from fleet.inventory.models import Gpu
from fleet.mps import MpsRequest, client_environment
from fleet.partitioning.models import PartitionKind


def allocation_environment(allocation: Allocation) -> dict[str, str]:
    """What a replica's process needs to run where it was placed.

    ``CUDA_VISIBLE_DEVICES`` names the MIG instance (its ``MIG-`` UUID once the agent created
    it) or the GPU (every GPU of a replica of several, joined by commas); an MPS share adds
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (when capped)
    and the daemon's
    ``CUDA_MPS_PIPE_DIRECTORY`` as the agent reported it. Empty until the device exists.
    """
    partition, gpu = allocation.partition, allocation.gpu
    device = partition.uuid if partition.kind == PartitionKind.MIG else gpu.uuid
    if not device:
        return {}
    if allocation.kind == RequestKind.GPU and (allocation.deployment.gpu_count or 1) > 1:
        device = ",".join(_replica_gpus(allocation)) or device
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


def _replica_gpus(allocation: Allocation) -> list[str]:
    """The GPUs of the replica copy ``allocation`` belongs to, in slot order: a replica of
    several whole GPUs is one workload that sees them all."""
    copy = Allocation.objects.filter(
        deployment_id=allocation.deployment_id,
        replica=allocation.replica,
        replaces__isnull=allocation.replaces_id is None,
        state=allocation.state,
    )
    return list(copy.order_by("gpu_slot", "pk").values_list("gpu__uuid", flat=True))


def _pipe_directory(gpu: Gpu, target_uuid: str) -> str | None:
    """The MPS pipe directory the agent reported for the daemon serving ``target_uuid``."""
    mps = gpu.observed.get("mps") if isinstance(gpu.observed, dict) else None
    if not isinstance(mps, dict):
        return None
    listed = mps.get("instances")
    daemons = [mps, *(listed if isinstance(listed, list) else [])]
    for daemon in daemons:
        if not isinstance(daemon, dict):
            continue
        if daemon.get("target_uuid", gpu.uuid) == target_uuid and daemon.get("pipe_directory"):
            return str(daemon["pipe_directory"])
    return None
