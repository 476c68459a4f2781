"""Reads of the partitioning app: what a GPU's layout is now."""

from __future__ import annotations

from fleet.inventory.models import Gpu, SharingMode
from fleet.partitioning import converters
from fleet.partitioning.models import PartitionKind
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec


def current_layout(gpu: Gpu) -> LayoutSpec:
    """The GPU's desired layout now, as a spec that recreates it."""
    partitions = list(gpu.partitions.all())
    if gpu.mode == SharingMode.MIG:
        return LayoutSpec(
            mode="mig",
            instances=tuple(
                MigInstanceSpec(
                    profile=int(p.profile_id or 0),
                    start=p.start,
                    mps=converters.mps_policy(p) if p.mps_enabled else None,
                )
                for p in partitions
                if p.kind == PartitionKind.MIG
            ),
        )
    whole = next((p for p in partitions if p.kind == PartitionKind.GPU), None)
    if gpu.mode == SharingMode.MPS and whole is not None:
        return LayoutSpec(mode="mps", mps=converters.mps_policy(whole))
    return LayoutSpec(mode=gpu.mode)
