"""Finding placements: layout suggestions and the enumeration of every valid layout.

The grids are tiny (at most 12 memory slices, 7 instances), so the search is exhaustive and exact:
a backtracking search with a memo of dead ends. Unlike ``nvidia-smi mig -cgi`` without explicit
placements, whose success depends on the creation order (facts §1.6), the result here depends only
on the multiset asked for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleet.domain import Violation
from fleet.mig.model import Placement, Product, Profile
from fleet.mig.rules import (
    DOES_NOT_FIT,
    MEDIA_EXTENSION_LIMIT,
    MEDIA_RULE,
    NOT_SUPPORTED,
    TOO_MANY_INSTANCES,
    Instance,
    Placed,
    can_add,
    count_violations,
    instance_sort_key,
    media_conflict,
    resolve,
    unknown_profile,
    validate_layout,
)


class UnknownProfileError(LookupError):
    """A profile reference that the product does not know."""

    def __init__(self, product: Product, ref: int | str) -> None:
        known = ", ".join(f"{p.id} ({p.name})" for p in product.profiles)
        super().__init__(f"{product.name} has no MIG profile {ref!r}; known profiles: {known}.")
        self.product = product
        self.ref = ref


@dataclass(frozen=True)
class LayoutPlan:
    """The answer to "can these profiles be added to this GPU, and where?".

    Attributes:
        instances: the new instances, by start (empty when it does not fit).
        violations: why it does not fit (empty when it fits).
    """

    instances: tuple[Instance, ...]
    violations: tuple[Violation, ...]

    @property
    def fits(self) -> bool:
        """Whether every wanted profile got a placement."""
        return not self.violations


def resolve_profiles(product: Product, wanted: Sequence[int | str]) -> tuple[Profile, ...]:
    """The profiles for ids or names, in the given order.

    Raises:
        UnknownProfileError: for the first reference the product does not know.
    """
    profiles = []
    for ref in wanted:
        profile = product.profile(ref)
        if profile is None:
            raise UnknownProfileError(product, ref)
        profiles.append(profile)
    return tuple(profiles)


def plan_layout(
    product: Product, wanted: Sequence[int | str], existing: Sequence[Instance] = ()
) -> LayoutPlan:
    """Placements for wanted profiles next to an existing layout, or every reason they do not fit.

    Like :func:`suggest_layout`, but never raises and explains a failure: ``mig.unknown_profile``,
    ``mig.not_supported``, the existing layout's own violations, ``mig.too_many_instances`` and
    ``mig.media_extension_limit`` for counts that can never fit, else ``mig.does_not_fit``.
    More wanted profiles than the product has instances are refused before any pairwise check,
    so the cost stays linear in ``wanted`` however long it is; the media rule is reported once.

    Args:
        product: the GPU product.
        wanted: profile ids or names (a multiset; order does not matter).
        existing: instances already on the GPU; they are kept where they are.

    Returns:
        The plan.
    """
    if wanted and not product.mig_capable:
        return _failed([Violation(NOT_SUPPORTED, f"{product.name} does not support MIG.", {})])
    unknown = [ref for ref in wanted if product.profile(ref) is None]
    if unknown:
        return _failed(unknown_profile(product, ref) for ref in unknown)
    if len(wanted) > product.max_instances:
        return _failed(count_violations(product, resolve_profiles(product, wanted)))
    current = validate_layout(product, existing)
    if current:
        return _failed(current)
    placed = resolve(product, existing)
    profiles = sorted(resolve_profiles(product, wanted), key=_largest_first)
    impossible = _impossible_counts(product, placed, profiles)
    if impossible:
        return _failed(impossible)
    found = _search(product, placed, profiles)
    if found is None:
        return _failed([_does_not_fit(product, placed, profiles)])
    new = [Instance(profile.id, where.start) for profile, where in found]
    return LayoutPlan(tuple(sorted(new, key=instance_sort_key)), ())


def too_many_instances(product: Product, count: int) -> Violation | None:
    """``mig.too_many_instances`` when ``count`` GPU instances are more than the product holds.

    Takes a number, not a list, so that a request for millions of instances is refused before
    anything of its size is built.

    Args:
        product: the GPU product (``nvidia-smi mig -lgip`` instance count of the full GPU).
        count: how many GPU instances are asked for.

    Returns:
        The violation, or ``None`` when ``count`` is within the product's limit.
    """
    if count <= product.max_instances:
        return None
    return Violation(
        TOO_MANY_INSTANCES,
        f"{count} GPU instances; {product.name} allows at most {product.max_instances}.",
        {"count": count, "max_instances": product.max_instances},
    )


def suggest_layout(
    product: Product, wanted: Sequence[int | str], existing: Sequence[Instance] = ()
) -> tuple[Instance, ...] | None:
    """Placements for a wanted multiset of profiles added to an existing layout.

    What ``nvmlDeviceCreateGpuInstanceWithPlacement`` should be called with, so that creation does
    not depend on order the way ``nvidia-smi mig -cgi`` does. Existing instances are never moved.
    The search is exhaustive (largest profiles first); among the solutions it prefers placements
    that keep the largest placements free. Deterministic.

    Args:
        product: the GPU product.
        wanted: profile ids or names.
        existing: instances already on the GPU.

    Returns:
        Only the new instances, sorted by start; ``None`` when they cannot all fit, or when the
        existing layout is itself invalid or the product has no MIG.

    Raises:
        UnknownProfileError: a wanted profile the product does not know.
    """
    if product.mig_capable:
        resolve_profiles(product, wanted)
    plan = plan_layout(product, wanted, existing)
    return plan.instances if plan.fits else None


def valid_layouts(
    product: Product, profile_ids: Sequence[int] | None = None
) -> tuple[tuple[Instance, ...], ...]:
    """Every valid layout (including the empty one) built from the given profiles.

    Args:
        product: the GPU product.
        profile_ids: profiles to use; all of the product's when ``None``.

    Returns:
        Layouts with instances by start, ordered by size then instances.
    """
    candidates = _candidates(product, profile_ids)
    layouts: list[tuple[Instance, ...]] = []
    placed: list[Placed] = []

    def extend(first: int) -> None:
        layouts.append(_as_layout(placed))
        for index in range(first, len(candidates)):
            profile, where = candidates[index]
            if can_add(product, placed, profile, where):
                placed.append((profile, where))
                extend(index + 1)
                placed.pop()

    extend(0)
    return _ordered(layouts)


def maximal_layouts(
    product: Product, profile_ids: Sequence[int] | None = None
) -> tuple[tuple[Instance, ...], ...]:
    """Valid layouts to which no instance of the given profiles can be added.

    With profiles 19/14/9/5/0 on the 8-unit family these are the 19 configurations of the MIG
    user guide's figure (facts §1.6).

    Args:
        product: the GPU product.
        profile_ids: profiles to use; all of the product's when ``None``.

    Returns:
        Layouts with instances by start, ordered by size then instances.
    """
    candidates = _candidates(product, profile_ids)
    return tuple(
        layout
        for layout in valid_layouts(product, profile_ids)
        if not any(can_add(product, resolve(product, layout), p, w) for p, w in candidates)
    )


def _failed(violations: Iterable[Violation]) -> LayoutPlan:
    return LayoutPlan((), tuple(violations))


def _largest_first(profile: Profile) -> tuple[int, int, int]:
    return (-profile.memory_slices, -profile.compute_slices, profile.id)


def _candidates(product: Product, profile_ids: Sequence[int] | None) -> list[Placed]:
    profiles = [p for p in product.profiles if profile_ids is None or p.id in profile_ids]
    return sorted(
        ((p, w) for p in profiles for w in p.placements), key=lambda c: (c[1].start, c[0].id)
    )


def _as_layout(placed: Sequence[Placed]) -> tuple[Instance, ...]:
    return tuple(sorted((Instance(p.id, w.start) for p, w in placed), key=instance_sort_key))


def _ordered(layouts: list[tuple[Instance, ...]]) -> tuple[tuple[Instance, ...], ...]:
    def key(layout: tuple[Instance, ...]) -> tuple[int, list[tuple[int, int]]]:
        return (len(layout), [instance_sort_key(i) for i in layout])

    return tuple(sorted(layouts, key=key))


def _impossible_counts(
    product: Product, placed: Sequence[Placed], wanted: Sequence[Profile]
) -> list[Violation]:
    """Counts that no placement can satisfy: per profile, per GPU, and the media rules."""
    everything = [p for p, _ in placed] + list(wanted)
    found = count_violations(product, everything)
    media = _media_violation(everything)
    if media is not None:
        found.append(media)
    return found


def _media_violation(profiles: Sequence[Profile]) -> Violation | None:
    """One ``mig.media_extension_limit`` for the whole set, naming the first conflicting pair and
    every profile in a conflict (one per pair would grow with the square of the count)."""
    pairs = [
        (profile, other)
        for index, profile in enumerate(profiles)
        for other in profiles[index + 1 :]
        if media_conflict(profile, other)
    ]
    if not pairs:
        return None
    first, second = pairs[0]
    involved = sorted({p.name for pair in pairs for p in pair})
    return Violation(
        MEDIA_EXTENSION_LIMIT,
        f"{first.name} and {second.name} cannot share a GPU: {MEDIA_RULE}",
        {"first": first.name, "second": second.name, "profiles": involved},
    )


def _does_not_fit(
    product: Product, placed: Sequence[Placed], wanted: Sequence[Profile]
) -> Violation:
    used = {i for _, where in placed for i in where.slices}
    free = product.memory_slice_count - len(used)
    needed = sum(p.memory_slices for p in wanted)
    names = " + ".join(p.name for p in wanted)
    return Violation(
        DOES_NOT_FIT,
        f"{names} do not fit on {product.name}: no set of non-overlapping placements exists "
        f"({needed} memory slices wanted, {free} free).",
        {"wanted": [p.name for p in wanted], "wanted_slices": needed, "free_slices": free},
    )


def _search(
    product: Product, existing: Sequence[Placed], wanted: Sequence[Profile]
) -> list[Placed] | None:
    """Exhaustive backtracking; ``(step, occupied slices)`` fully decides what is still possible."""
    placed = list(existing)
    dead_ends: set[tuple[int, frozenset[int]]] = set()

    def step(index: int) -> bool:
        if index == len(wanted):
            return True
        occupied = frozenset(i for _, where in placed for i in where.slices)
        if (index, occupied) in dead_ends:
            return False
        profile = wanted[index]
        options = [w for w in profile.placements if can_add(product, placed, profile, w)]
        for where in sorted(options, key=lambda w: _preference(product, occupied, w)):
            placed.append((profile, where))
            if step(index + 1):
                return True
            placed.pop()
        dead_ends.add((index, occupied))
        return False

    return placed[len(existing) :] if step(0) else None


def _preference(product: Product, occupied: frozenset[int], where: Placement) -> tuple[int, ...]:
    """Smaller is better: keep as many large placements free as possible, then prefer high starts.

    High starts first mirror the driver, which puts a lone ``1g`` at slice 6 (facts §1.2).
    """
    taken = occupied | set(where.slices)
    free_by_size: Counter[int] = Counter(
        w.size for p in product.profiles for w in p.placements if taken.isdisjoint(w.slices)
    )
    sizes = sorted({w.size for p in product.profiles for w in p.placements}, reverse=True)
    return (*(-free_by_size[size] for size in sizes), -where.start)
