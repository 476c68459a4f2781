"""MIG targets on one GPU: free partitions of the profile, else the best new instance.

Fragmentation of a MIG GPU: for each distinct profile size of the product, the free memory slices
that no free placement of that size covers, summed. Creating an instance where that grows least
keeps large profiles placeable.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.domain import Violation
from fleet.mig import Instance, Product, Profile, free_placements, occupied_slices, product_by_key
from fleet.placement.snapshot import GpuState


@dataclass(frozen=True)
class MigOptions:
    """What one GPU offers a MIG request."""

    free_partitions: tuple[int, ...]
    new_instance: Instance | None
    score: float
    no_room: Violation


def options(gpu: GpuState, profile_ref: str | int, strategy: str) -> MigOptions | Violation:
    """Free partitions of the profile and the best new instance on ``gpu``, or why none."""
    product = product_by_key(gpu.product_key) if gpu.product_key else None
    profile = product.profile(profile_ref) if product is not None else None
    if product is None or profile is None:
        return Violation(
            "placement.profile_unavailable",
            f"GPU {gpu.id} ({gpu.product_key or 'unknown product'}) offers no {profile_ref}.",
            {"product": gpu.product_key, "profile": str(profile_ref)},
        )
    free = tuple(p.id for p in gpu.partitions if p.profile_id == profile.id and not p.occupied)
    instances = tuple(Instance(p.profile_id, p.start) for p in gpu.partitions)
    new, score = best_new_instance(product, profile, instances, strategy)
    no_room = Violation(
        "placement.no_free_space",
        f"No {profile.name} placement is free on GPU {gpu.id}.",
        {"profile": profile.name},
    )
    return MigOptions(free, new, score, no_room)


def fragmentation(product: Product, instances: tuple[Instance, ...]) -> int:
    """Free memory slices, summed over profile sizes, that no free placement of that size covers."""
    free = set(range(product.memory_slice_count)) - occupied_slices(product, instances)
    total = 0
    seen: set[int] = set()
    for profile in product.profiles:
        if profile.memory_slices in seen:
            continue
        seen.add(profile.memory_slices)
        covered: set[int] = set()
        for where in free_placements(product, profile.id, instances):
            covered.update(where.slices)
        total += len(free - covered)
    return total


def best_new_instance(
    product: Product, profile: Profile, instances: tuple[Instance, ...], strategy: str
) -> tuple[Instance | None, float]:
    """The instance to create for ``profile`` under ``strategy``, with its score (higher better)."""
    places = free_placements(product, profile.id, instances)
    if not places:
        return None, 0.0
    slices = max(1, product.memory_slice_count)
    free_after = slices - len(occupied_slices(product, instances)) - places[0].size
    if strategy == "first_fit":
        return Instance(profile.id, places[0].start), 0.0
    if strategy == "best_fit":
        return Instance(profile.id, places[-1].start), -free_after / slices
    before = fragmentation(product, instances)
    best: tuple[float, Instance] | None = None
    for where in places:
        candidate = Instance(profile.id, where.start)
        growth = fragmentation(product, (*instances, candidate)) - before
        score = -(growth + free_after / slices) / slices
        if best is None or score > best[0]:
            best = (score, candidate)
    assert best is not None
    return best[1], best[0]
