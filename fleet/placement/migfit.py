"""MIG targets on one GPU: free partitions of the profile, else the best new instance.

Fragmentation of a MIG GPU: for each distinct profile size of the product, the free memory slices
that no free placement of that size covers, summed. Creating an instance where that grows least
keeps large profiles placeable.

Profile lookups and free placements are pure functions of a product and a layout, and a fleet
repeats a few layouts on many GPUs: they are memoised per product object (the catalog's are
shared by every GPU that reports no placements of its own), a bounded number of products at once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet.domain import Violation
from fleet.mig import Instance, Placement, Product, Profile, product_by_key
from fleet.mig import free_placements as _free_placements
from fleet.mig import occupied_slices as _occupied_slices
from fleet.placement.snapshot import GpuState

MEMO_PRODUCTS = 1024
_MEMOS: OrderedDict[int, tuple[Product, dict[Any, Any]]] = OrderedDict()


def _memo(product: Product) -> dict[Any, Any]:
    entry = _MEMOS.get(id(product))
    if entry is None or entry[0] is not product:
        entry = (product, {})
        _MEMOS[id(product)] = entry
        while len(_MEMOS) > MEMO_PRODUCTS:
            _MEMOS.popitem(last=False)
    return entry[1]


def memoised(product: Product, key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, memoised under ``key`` for ``product`` (a pure function of the product
    and of what ``key`` names)."""
    memo = _memo(product)
    if key not in memo:
        memo[key] = compute()
    return memo[key]


def find_profile(product: Product, ref: str | int) -> Profile | None:
    """``product.profile(ref)``, memoised."""
    memo = _memo(product)
    key = ("profile", ref)
    if key not in memo:
        memo[key] = product.profile(ref)
    found: Profile | None = memo[key]
    return found


def free_placements(
    product: Product, profile_id: int, instances: tuple[Instance, ...]
) -> tuple[Placement, ...]:
    """:func:`fleet.mig.free_placements`, memoised."""
    memo = _memo(product)
    key = ("free", profile_id, tuple((i.profile_id, i.start) for i in instances))
    found = memo.get(key)
    if found is None:
        found = memo[key] = _free_placements(product, profile_id, instances)
    return found


def occupied_slices(product: Product, instances: tuple[Instance, ...]) -> frozenset[int]:
    """:func:`fleet.mig.occupied_slices`, memoised."""
    memo = _memo(product)
    key = ("occupied", tuple((i.profile_id, i.start) for i in instances))
    found = memo.get(key)
    if found is None:
        found = memo[key] = _occupied_slices(product, instances)
    return found


@dataclass(frozen=True)
class MigOptions:
    """What one GPU offers a MIG request."""

    free_partitions: tuple[int, ...]
    new_instance: Instance | None
    score: float
    no_room: Violation


def product_of(gpu: GpuState) -> Product | None:
    """The GPU's product: with the placements its agent reported, else the catalog's."""
    if gpu.product is not None:
        return gpu.product
    return product_by_key(gpu.product_key) if gpu.product_key else None


def profile_on(gpu: GpuState, profile_ref: str | int) -> tuple[Product, Profile] | Violation:
    """The GPU's product and the profile ``profile_ref`` names on it, or why there is none."""
    product = product_of(gpu)
    profile = find_profile(product, profile_ref) if product is not None else None
    if product is None or profile is None:
        known = [p.name for p in product.profiles] if product is not None else []
        return Violation(
            "placement.profile_unavailable",
            f"GPU {gpu.id} ({gpu.product_key or 'unknown product'}) offers no {profile_ref}.",
            {"product": gpu.product_key, "profile": str(profile_ref), "known_profiles": known},
        )
    return product, profile


def options(gpu: GpuState, profile_ref: str | int, strategy: str) -> MigOptions | Violation:
    """Free partitions of the profile and the best new instance on ``gpu``, or why none."""
    found = profile_on(gpu, profile_ref)
    if isinstance(found, Violation):
        return found
    product, profile = found
    free = tuple(p.id for p in gpu.partitions if p.profile_id == profile.id and not p.occupied)
    instances = tuple(Instance(p.profile_id, p.start) for p in gpu.partitions)
    new, score = best_new_instance(product, profile, instances, strategy)
    no_room = Violation(
        "placement.no_free_space",
        f"No {profile.name} placement is free on GPU {gpu.id}.",
        {"profile": profile.name},
    )
    return MigOptions(free, new, score, no_room)


def instance_at(gpu: GpuState, profile_ref: str | int, start: int) -> Instance | Violation:
    """A new instance of the profile at ``start``, if that placement is free beside every
    instance of the GPU (busy or idle: none is touched)."""
    found = profile_on(gpu, profile_ref)
    if isinstance(found, Violation):
        return found
    product, profile = found
    instances = tuple(Instance(p.profile_id, p.start) for p in gpu.partitions)
    if start in {where.start for where in free_placements(product, profile.id, instances)}:
        return Instance(profile.id, start)
    return Violation(
        "placement.no_free_space",
        f"No {profile.name} placement is free at slice {start} on GPU {gpu.id}.",
        {"profile": profile.name, "start": start},
    )


def fragmentation(product: Product, instances: tuple[Instance, ...]) -> int:
    """Free memory slices, summed over profile sizes, that no free placement of that size covers
    (memoised)."""
    memo = _memo(product)
    key = ("fragmentation", tuple((i.profile_id, i.start) for i in instances))
    found = memo.get(key)
    if found is None:
        found = memo[key] = _fragmentation(product, instances)
    return found


def _fragmentation(product: Product, instances: tuple[Instance, ...]) -> int:
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


def covered_slices(
    product: Product, profile: Profile, instances: tuple[Instance, ...], reusable: frozenset[int]
) -> frozenset[int]:
    """Memory slices a request of ``profile`` could still use: its free placements beside every
    instance, and the slices of idle instances of that profile (``reusable``, as a free partition
    is used before a new instance is created)."""
    covered: set[int] = set(reusable)
    for where in free_placements(product, profile.id, instances):
        covered.update(where.slices)
    return frozenset(covered)


def size_profiles(product: Product) -> tuple[Profile, ...]:
    """One profile per distinct memory size (the first, largest first): the sizes whose
    placeability :func:`fragmentation` measures."""
    seen: set[int] = set()
    out: list[Profile] = []
    for profile in product.profiles:
        if profile.memory_slices not in seen:
            seen.add(profile.memory_slices)
            out.append(profile)
    return tuple(out)
