"""Rows to domain values: the one place that turns ORM rows into ``fleet.mig``/``fleet.mps``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleet.inventory.models import Gpu
from fleet.mig import Instance, Placement, Product, find_product, product_by_key
from fleet.mps import MpsDevice, MpsPolicy, MpsRequest
from fleet.partitioning.models import Partition, PartitionKind


def catalog_product(gpu: Gpu) -> Product | None:
    """The catalog entry of the GPU's product, before agent-reported placements."""
    if gpu.product_key:
        product = product_by_key(gpu.product_key)
        if product is not None:
            return product
    return find_product(name=gpu.product_name) or find_product(
        pci_device_id=gpu.pci_device_id or None
    )


def reported_placements(raw: Mapping[str, Any]) -> dict[int, tuple[Placement, ...]]:
    """``{"19": [[0, 1], ...]}`` as the agent reports them, or ``{"19": {"placements": ...}}``."""
    parsed: dict[int, tuple[Placement, ...]] = {}
    for profile_id, value in raw.items():
        pairs = value.get("placements", []) if isinstance(value, Mapping) else value
        parsed[int(profile_id)] = tuple(Placement(int(s), int(z)) for s, z in pairs)
    return parsed


def product_of(gpu: Gpu) -> Product | None:
    """The GPU's product, with the placements its agent read from NVML overriding the catalog."""
    product = catalog_product(gpu)
    if product is None or not gpu.reported_placements:
        return product
    return product.with_placements(reported_placements(gpu.reported_placements))


def mig_instances(partitions: Iterable[Partition]) -> tuple[Instance, ...]:
    return tuple(
        Instance(profile_id=p.profile_id, start=p.start)
        for p in partitions
        if p.kind == PartitionKind.MIG and p.profile_id is not None
    )


def mps_device(partition: Partition, product: Product | None) -> MpsDevice:
    """The MPS capacity of a partition: the whole GPU, or one MIG instance (fewer clients)."""
    if partition.kind == PartitionKind.MIG and product is not None and product.compute_slice_count:
        return MpsDevice.mig_instance(
            partition.memory_mib, partition.compute_slices, product.compute_slice_count
        )
    return MpsDevice.whole_gpu(partition.memory_mib)


def mps_policy(partition: Partition) -> MpsPolicy:
    return MpsPolicy(
        default_active_thread_percentage=partition.mps_default_active_thread_percentage,
        default_pinned_mem_limit_mib=partition.mps_default_pinned_mem_limit_mib,
        max_clients=partition.mps_max_clients,
    )


def mps_request(memory_mib: int, compute_percent: int | None) -> MpsRequest:
    return MpsRequest(memory_mib=memory_mib, max_compute_percent=compute_percent)
