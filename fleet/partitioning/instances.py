"""One MIG instance destroyed, the rest of its GPU's layout kept: what a defragmentation and a
reclaim do to the slices their moves and stops left idle."""

from __future__ import annotations

from typing import Any

from fleet.core.models import Operation
from fleet.partitioning.models import Partition
from fleet.partitioning.selectors import current_layout
from fleet.partitioning.services import LayoutSpec, gpu_set_layout


def instance_destroy(partition: Partition, *, requested_by: Any = None) -> Operation:
    """Set the partition's GPU to its current layout without the partition's instance (the
    caller has checked that nothing is placed on it); the ``set_layout`` operation."""
    spec = current_layout(partition.gpu)
    kept = tuple(i for i in spec.instances if i.start != partition.start)
    return gpu_set_layout(
        gpu_id=partition.gpu_id,
        spec=LayoutSpec(mode=spec.mode, instances=kept),
        requested_by=requested_by,
    )
