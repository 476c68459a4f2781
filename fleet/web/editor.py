"""The MIG layout editor's model: the product's profiles with their valid placements, the GPU's
current instances (and which of them run work), and presets computed by ``fleet.mig``."""

from __future__ import annotations

from typing import Any

from fleet.inventory.models import Gpu, SharingMode
from fleet.mig import Product, Profile, suggest_layout
from fleet.partitioning import converters
from fleet.partitioning.models import Partition, PartitionKind

# Presets in compute slices per instance; each becomes the profiles of the product with that many
# compute slices and the fewest memory slices (no media extensions), placed by fleet.mig. A shape
# ending in ``FILL`` repeats its first size as often as the product allows; -1 is the largest.
FILL = 0
PRESETS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("all-1g", "All 1g", (1, FILL)),
    ("all-2g", "All 2g", (2, FILL)),
    ("balanced", "Balanced", (3, 2, 1, 1)),
    ("balanced", "Balanced", (2, 1, 1)),
    ("halves", "Halves", (3, 3)),
    ("4-3", "4g + 3g", (4, 3)),
    ("whole", "Whole GPU", (-1,)),
)


def _plain_profile(product: Product, compute_slices: int) -> Profile | None:
    candidates = [
        p for p in product.profiles if p.compute_slices == compute_slices and p.media == ""
    ]
    return min(candidates, key=lambda p: (p.memory_slices, p.id), default=None)


def _fit(product: Product, profile_ids: list[int]) -> list[dict[str, int]] | None:
    found = suggest_layout(product, profile_ids)
    if found is None:
        return None
    return [{"profile_id": i.profile_id, "start": i.start} for i in found]


def presets(product: Product) -> list[dict[str, Any]]:
    """Named layouts valid on this product (each checked by ``fleet.mig.suggest_layout``)."""
    found: list[dict[str, Any]] = []
    seen: set[tuple[tuple[int, int], ...]] = set()
    largest = max((p.compute_slices for p in product.profiles), default=0)
    for key, label, shape in PRESETS:
        if any(p["key"] == key for p in found):
            continue
        instances = _preset_instances(product, shape, largest)
        if not instances:
            continue
        ident = tuple(sorted((i["profile_id"], i["start"]) for i in instances))
        if ident in seen:
            continue
        seen.add(ident)
        found.append({"key": key, "label": label, "instances": instances})
    return found


def _preset_instances(
    product: Product, shape: tuple[int, ...], largest: int
) -> list[dict[str, int]] | None:
    if shape[-1] == FILL:
        profile = _plain_profile(product, shape[0])
        if profile is None:
            return None
        for count in range(product.max_instances, 1, -1):
            instances = _fit(product, [profile.id] * count)
            if instances:
                return instances
        return None
    wanted = [largest if c == -1 else c for c in shape]
    profiles = [_plain_profile(product, c) for c in wanted]
    if any(p is None for p in profiles):
        return None
    return _fit(product, [p.id for p in profiles if p is not None])


def profile_dict(profile: Profile) -> dict[str, Any]:
    return {
        "id": profile.id,
        "name": profile.name,
        "compute_slices": profile.compute_slices,
        "memory_slices": profile.memory_slices,
        "memory_mib": profile.memory_mib,
        "max_instances": profile.max_instances,
        "media": profile.media,
        "placements": [[p.start, p.size] for p in profile.placements],
    }


def _mps_policy(partition: Partition) -> dict[str, int | None] | None:
    """The MPS policy inside a MIG instance as the layout API takes it, ``None`` without MPS
    (the editor sends it back for kept instances, so applying a layout never drops it)."""
    return converters.mps_policy(partition).as_dict() if partition.mps_enabled else None


def editor_model(gpu: Gpu, product: Product | None) -> dict[str, Any]:
    """Everything the editor's script needs, embedded in the page with ``json_script``."""
    partitions: list[Partition] = list(gpu.partitions.all())
    current = [
        {
            "partition_id": p.pk,
            "profile_id": p.profile_id,
            "profile": p.profile_name,
            "start": p.start,
            "size": p.size,
            "busy": sorted({f"{a.deployment.name}[{a.replica}]" for a in p.allocations.all()}),
            "mps": _mps_policy(p),
        }
        for p in partitions
        if p.kind == PartitionKind.MIG and gpu.mode == SharingMode.MIG
    ]
    whole_busy = sorted(
        {
            f"{a.deployment.name}[{a.replica}]"
            for p in partitions
            if p.kind == PartitionKind.GPU
            for a in p.allocations.all()
        }
    )
    return {
        "gpu": gpu.pk,
        "mode": gpu.mode,
        "mig_capable": bool(product and product.mig_capable and gpu.mig_capable),
        "product": product.name if product else gpu.product_name,
        "slice_count": product.memory_slice_count if product else 0,
        "max_instances": product.max_instances if product else 0,
        "profiles": [profile_dict(p) for p in product.profiles] if product else [],
        "current": current,
        "whole_busy": whole_busy,
        "presets": presets(product) if product and product.mig_capable else [],
    }
