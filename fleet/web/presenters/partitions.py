"""The GPU detail's partition table: one row per MIG instance or whole GPU, with the processes
that run in it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet.inventory.models import Gpu
from fleet.partitioning.models import Partition, PartitionKind
from fleet.web.presenters.formats import heat_bucket
from fleet.web.presenters.gpu_cards import AllocationView, GpuCard, partition_of_instance


@dataclass(frozen=True)
class PartitionRow:
    """One row of the GPU detail's partition table."""

    partition_id: int
    label: str
    placement: str
    memory_mib: int
    mps: str
    allocations: tuple[AllocationView, ...]
    processes: tuple[dict[str, Any], ...]
    utilization_percent: float | None
    memory_used_mib: float | None

    @property
    def heat(self) -> str:
        return heat_bucket(self.utilization_percent)


def _processes_by_partition(
    gpu: Gpu, partitions: list[Partition], sample: dict[str, Any]
) -> dict[int, list[dict[str, Any]]]:
    """Processes (the sample's ``processes``) under the partition they run in: a MIG process
    names its GPU instance, which the agent's observed instances map to a placement start."""
    raw = sample.get("processes")
    owners = partition_of_instance(gpu, partitions)
    whole = next((p.pk for p in partitions if p.kind == PartitionKind.GPU), None)
    found: dict[int, list[dict[str, Any]]] = {}
    replicas = {
        a.pk: f"replica {a.replica} of {a.deployment.name}"
        for p in partitions
        for a in p.allocations.all()
    }
    for process in raw or []:
        if not isinstance(process, dict):
            continue
        gi = process.get("gpu_instance_id")
        target = owners.get(gi) if gi is not None else whole
        if target is not None:
            owner = replicas.get(process.get("allocation_id"))  # type: ignore[arg-type]
            found.setdefault(target, []).append({**process, "owner": owner})
    return found


def partition_rows(gpu: Gpu, card: GpuCard, sample: dict[str, Any] | None) -> list[PartitionRow]:
    partitions = list(gpu.partitions.all())
    raw = sample if sample is not None else gpu.last_telemetry
    processes = _processes_by_partition(gpu, partitions, raw if isinstance(raw, dict) else {})
    rows = [
        PartitionRow(
            partition_id=s.partition_id,
            label=f"MIG {s.profile}",
            placement=f"slices {s.start}-{s.start + s.size - 1}"
            if s.size > 1
            else f"slice {s.start}",
            memory_mib=s.memory_mib,
            mps="MPS inside" if s.mps_enabled else "",
            allocations=s.allocations,
            processes=tuple(processes.get(s.partition_id, [])),
            utilization_percent=s.utilization_percent,
            memory_used_mib=s.memory_used_mib,
        )
        for s in card.slices
    ]
    if card.whole_partition_id is not None and not card.is_mig:
        rows.append(
            PartitionRow(
                partition_id=card.whole_partition_id,
                label="Whole GPU (MPS)" if card.is_mps else "Whole GPU (dedicated)",
                placement="all",
                memory_mib=card.memory_mib,
                mps="MPS daemon" if card.mps_enabled else "",
                allocations=card.shares,
                processes=tuple(processes.get(card.whole_partition_id, [])),
                utilization_percent=card.live.utilization_percent,
                memory_used_mib=card.live.memory_used_mib,
            )
        )
    return rows
