"""Rows to domain values: the one place that turns ORM rows into ``fleet.mig``/``fleet.mps``."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from fleet.core.ratelimit import OncePer, cut
from fleet.inventory.models import Gpu
from fleet.mig import Instance, Placement, Product, Profile, find_product, product_by_key
from fleet.mps import MpsDevice, MpsPolicy, MpsRequest
from fleet.partitioning.models import Partition, PartitionKind
from hostagent.protocol import MAX_MEMORY_SLICES

logger = logging.getLogger(__name__)
_warn_once = OncePer(60.0)


def catalog_product(gpu: Gpu) -> Product | None:
    """The catalog entry of the GPU's product, before agent-reported placements."""
    if gpu.product_key:
        product = product_by_key(gpu.product_key)
        if product is not None:
            return product
    return find_product(name=gpu.product_name) or find_product(
        pci_device_id=gpu.pci_device_id or None
    )


def reported_placements(
    raw: Mapping[str, Any], slice_count: int = MAX_MEMORY_SLICES
) -> dict[int, tuple[Placement, ...]]:
    """``{"19": [[0, 1], ...]}`` as the agent reports them, or ``{"19": {"placements": ...}}``.

    What was stored is read defensively (rows written before the protocol bounded placements,
    or by hand): an entry that is not a profile id with ``[start, size]`` pairs inside the
    ``slice_count`` grid is ignored, with a logged reason, so no stored value can make a page
    or a service raise."""
    parsed: dict[int, tuple[Placement, ...]] = {}
    for profile_id, value in raw.items():
        pairs = value.get("placements", []) if isinstance(value, Mapping) else value
        try:
            parsed[int(profile_id)] = tuple(_placement(pair, slice_count) for pair in pairs)
        except (TypeError, ValueError) as error:
            if _warn_once(str(profile_id)):
                logger.warning(
                    "stored placements of profile %s ignored: %s", cut(profile_id), error
                )
    return parsed


def _placement(pair: Any, slice_count: int) -> Placement:
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        raise ValueError(f"{cut(pair)} is not [start, size]")
    start, size = pair
    if not isinstance(start, int) or not isinstance(size, int):
        raise TypeError(f"{cut(pair)} is not two integers")
    if start < 0 or size < 1 or start + size > slice_count:
        raise ValueError(f"{cut(pair)} is outside a grid of {slice_count} slices")
    return Placement(start, size)


def product_of(gpu: Gpu) -> Product | None:
    """The GPU's product, with the placements its agent read from NVML overriding the catalog."""
    product = catalog_product(gpu)
    if product is None or not isinstance(gpu.reported_placements, Mapping):
        return product
    if not gpu.reported_placements:
        return product
    return product.with_placements(
        reported_placements(gpu.reported_placements, product.memory_slice_count)
    )


def mig_partition(gpu: Gpu, profile: Profile, start: int) -> Partition:
    """The (unsaved) row of a MIG instance of ``profile`` at ``start`` on ``gpu``: domain -> row,
    the one place a MIG partition is made."""
    return Partition(
        gpu=gpu,
        kind=PartitionKind.MIG,
        profile_id=profile.id,
        profile_name=profile.name,
        start=start,
        size=profile.placement_at(start).size,
        compute_slices=profile.compute_slices,
        memory_mib=profile.memory_mib,
    )


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
