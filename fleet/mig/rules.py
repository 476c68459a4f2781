"""MIG layout rules: which sets of GPU instances a product accepts.

A layout is valid when every instance uses a placement NVML lists for its profile
(``nvmlDeviceGetGpuInstancePossiblePlacements_v2``), no two instances share a memory slice, the
instance counts hold, and the media-extension rules hold (facts §0.3, §1.6, §2). These are the
rules ``nvmlDeviceCreateGpuInstanceWithPlacement`` enforces with ``NVML_ERROR_INVALID_ARGUMENT``
(bad placement) and ``NVML_ERROR_INSUFFICIENT_RESOURCES`` (everything else).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.domain import Violation
from fleet.mig.model import Placement, Product, Profile

UNKNOWN_PRODUCT = "mig.unknown_product"
NOT_SUPPORTED = "mig.not_supported"
UNKNOWN_PROFILE = "mig.unknown_profile"
PLACEMENT_NOT_ALLOWED = "mig.placement_not_allowed"
OVERLAP = "mig.overlap"
TOO_MANY_INSTANCES = "mig.too_many_instances"
MEDIA_EXTENSION_LIMIT = "mig.media_extension_limit"
DOES_NOT_FIT = "mig.does_not_fit"
DEVICE_FILTER_MISMATCH = "mig.device_filter_mismatch"

MEDIA_RULE = (
    "at most one +me instance per GPU, and a +me.all instance allows only -me profiles "
    "besides itself."
)

# Profiles capped at one per GPU by a media rule; their instance count is checked by that rule.
_MEDIA_LIMITED = ("+me", "+me.all")


@dataclass(frozen=True)
class Instance:
    """A GPU instance of a layout: a profile at a start slice (its size comes from the profile).

    Attributes:
        profile_id: NVML profile id (``nvmlGpuInstanceInfo_t.profileId``).
        start: first memory slice (``nvmlGpuInstanceInfo_t.placement.start``).
    """

    profile_id: int
    start: int


Placed = tuple[Profile, Placement]
"""An instance resolved against a product: its profile and its memory-slice interval."""


def instance_sort_key(instance: Instance) -> tuple[int, int]:
    """Orders instances by start slice, then profile id (the order layouts are shown in)."""
    return (instance.start, instance.profile_id)


def resolve(product: Product, instances: Iterable[Instance]) -> list[Placed]:
    """Profiles and placements of the instances whose profile the product knows, by start."""
    placed = []
    for instance in sorted(instances, key=instance_sort_key):
        profile = product.profile(instance.profile_id)
        if profile is not None:
            placed.append((profile, profile.placement_at(instance.start)))
    return placed


def describe(profile: Profile, placement: Placement) -> str:
    """``1g.5gb at 3:1`` — profile name and ``start:size``, as ``nvidia-smi mig -lgi`` shows."""
    return f"{profile.name} at {placement.start}:{placement.size}"


def media_conflict(a: Profile, b: Profile) -> bool:
    """Whether two profiles may not share a GPU because of their media engines.

    At most one ``+me`` instance per GPU: a ``+me`` profile gets the GPU's only JPEG/OFA engines,
    so on the A30 this also means one ``1g+me`` or one ``2g+me``, not both (◐ from the engine
    counts, facts §1.5 and §2). A ``+me.all`` instance takes every media engine and "prevents
    allocation of all but _NO_ME profiles" (nvml.h ``NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME``).
    """
    if a.media == "+me" and b.media == "+me":
        return True
    return (a.media == "+me.all" and b.media != "-me") or (
        b.media == "+me.all" and a.media != "-me"
    )


def can_add(product: Product, placed: Sequence[Placed], profile: Profile, where: Placement) -> bool:
    """Whether an instance of ``profile`` at ``where`` fits next to an already valid layout.

    The caller guarantees ``where`` is one of ``profile.placements``.
    """
    if len(placed) >= product.max_instances:
        return False
    if sum(1 for other, _ in placed if other.id == profile.id) >= profile.max_instances:
        return False
    return not any(
        where.overlaps(other_where) or media_conflict(profile, other)
        for other, other_where in placed
    )


def occupied_slices(product: Product, instances: Sequence[Instance]) -> frozenset[int]:
    """Memory slices used by the instances (unknown profiles are ignored).

    The union of ``nvmlGpuInstanceInfo_t.placement`` intervals, as ``nvidia-smi mig -lgi`` lists.
    """
    return frozenset(i for _, where in resolve(product, instances) for i in where.slices)


def free_placements(
    product: Product, profile_id: int | str, instances: Sequence[Instance]
) -> tuple[Placement, ...]:
    """Placements where one more instance of a profile could be created now.

    The layout-aware counterpart of ``nvmlDeviceGetGpuInstancePossiblePlacements_v2`` and
    ``nvmlDeviceGetGpuInstanceRemainingCapacity``: placements that overlap no instance and respect
    the instance counts and media-extension rules.

    Args:
        product: the GPU product.
        profile_id: the profile (id, or name as :meth:`Product.profile` accepts).
        instances: the current layout, assumed valid.

    Returns:
        The placements, by start; empty for an unknown profile or a product without MIG.
    """
    profile = product.profile(profile_id)
    if profile is None:
        return ()
    placed = resolve(product, instances)
    return tuple(where for where in profile.placements if can_add(product, placed, profile, where))


def validate_layout(product: Product, instances: Sequence[Instance]) -> tuple[Violation, ...]:
    """Every rule the layout breaks; empty when ``nvidia-smi mig -cgi`` could create it all.

    Checks each instance's profile (``mig.unknown_profile``) and start
    (``mig.placement_not_allowed``, against ``nvidia-smi mig -lgipp``), every pair of instances
    (``mig.overlap``, ``mig.media_extension_limit``), and the instance counts
    (``mig.too_many_instances``). An empty layout is always valid; any instance on a product
    without MIG gives ``mig.not_supported``. The result does not depend on the instances' order.

    Args:
        product: the GPU product (with agent-reported placements where known).
        instances: the GPU instances, in any order.

    Returns:
        All violations, in a stable order.
    """
    if not instances:
        return ()
    if not product.mig_capable:
        return (
            Violation(
                NOT_SUPPORTED,
                f"{product.name} does not support MIG.",
                {"product": product.key},
            ),
        )
    ordered = sorted(instances, key=instance_sort_key)
    found = [_unknown(product, i) for i in ordered if product.profile(i.profile_id) is None]
    placed = resolve(product, instances)
    found += [_not_allowed(p, w) for p, w in placed if not p.allows_start(w.start)]
    found += _pair_violations(placed)
    found += count_violations(product, [profile for profile, _ in placed])
    return tuple(found)


def _unknown(product: Product, instance: Instance) -> Violation:
    return unknown_profile(product, instance.profile_id, start=instance.start)


def unknown_profile(product: Product, ref: int | str, **details: Any) -> Violation:
    """``mig.unknown_profile``: ``ref`` (an id or a name) is not a profile of ``product``; the
    message and ``details.known_profiles`` list the ones it has.

    Args:
        product: the GPU product.
        ref: the reference that was not found.
        **details: more context for the violation's details (``start``, say).

    Returns:
        The violation.
    """
    known = [p.name for p in product.profiles]
    listed = ", ".join(f"{p.id} ({p.name})" for p in product.profiles)
    return Violation(
        UNKNOWN_PROFILE,
        f"{product.name} has no MIG profile {ref!r}; known profiles: {listed}.",
        {
            "profile": ref,
            "profile_id": ref if isinstance(ref, int) else None,
            "product": product.key,
            "known_profiles": known,
            **details,
        },
    )


def resolve_instances(
    product: Product, wanted: Iterable[tuple[int | str, int]]
) -> tuple[tuple[Instance, ...], tuple[Violation, ...]]:
    """The one resolver of profile references: instances for ``(profile id or name, start)``
    pairs, and a ``mig.unknown_profile`` violation for every reference the product lacks.

    Args:
        product: the GPU product (with its agent-reported placements, where known).
        wanted: profile references with their start slices, in order.

    Returns:
        The instances of the known references (in order), and the violations of the others.
    """
    instances: list[Instance] = []
    violations: list[Violation] = []
    for ref, start in wanted:
        profile = product.profile(ref)
        if profile is None:
            violations.append(unknown_profile(product, ref, start=start))
        else:
            instances.append(Instance(profile_id=profile.id, start=start))
    return tuple(instances), tuple(violations)


def _facts(profile: Profile, where: Placement) -> dict[str, Any]:
    return {
        "profile_id": profile.id,
        "profile": profile.name,
        "start": where.start,
        "size": where.size,
    }


def _not_allowed(profile: Profile, where: Placement) -> Violation:
    starts = ", ".join(str(p.start) for p in profile.placements)
    return Violation(
        PLACEMENT_NOT_ALLOWED,
        f"{profile.name} cannot start at memory slice {where.start}; allowed starts: {starts}.",
        {**_facts(profile, where), "allowed_starts": [p.start for p in profile.placements]},
    )


def _pair_violations(placed: Sequence[Placed]) -> list[Violation]:
    found = []
    for index, (profile, where) in enumerate(placed):
        for other, other_where in placed[index + 1 :]:
            facts = {"first": _facts(profile, where), "second": _facts(other, other_where)}
            pair = f"{describe(profile, where)} and {describe(other, other_where)}"
            if where.overlaps(other_where):
                found.append(Violation(OVERLAP, f"{pair} share memory slices.", facts))
            if media_conflict(profile, other):
                found.append(
                    Violation(
                        MEDIA_EXTENSION_LIMIT,
                        f"{pair} cannot share a GPU: {MEDIA_RULE}",
                        facts,
                    )
                )
    return found


def count_violations(product: Product, profiles: Sequence[Profile]) -> list[Violation]:
    """``mig.too_many_instances`` for the instance counts of a multiset of profiles.

    Per profile (``instanceCount`` of ``nvidia-smi mig -lgip``) and per GPU. Profiles capped by a
    media rule are left to :func:`media_conflict`.
    """
    found = []
    for profile, count in Counter(profiles).items():
        if profile.media not in _MEDIA_LIMITED and count > profile.max_instances:
            found.append(
                Violation(
                    TOO_MANY_INSTANCES,
                    f"{count} instances of {profile.name}; at most {profile.max_instances} fit.",
                    {"profile_id": profile.id, "profile": profile.name, "count": count},
                )
            )
    if len(profiles) > product.max_instances:
        found.append(
            Violation(
                TOO_MANY_INSTANCES,
                f"{len(profiles)} GPU instances; {product.name} allows at most "
                f"{product.max_instances}.",
                {"count": len(profiles), "max_instances": product.max_instances},
            )
        )
    return found
