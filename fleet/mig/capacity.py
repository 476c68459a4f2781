"""How many instances of a profile a GPU can still give: now, and after its idle instances go.

Exact, by the catalog's rules: the planner (:func:`fleet.mig.planning.plan_layout`) is asked for
one, two, ... more instances of the profile beside the kept instances until it refuses, so every
rule it knows counts (placements, overlaps, the per-profile and per-GPU instance counts, one
``+me`` per GPU). The grids are tiny (at most 7 instances), so this is a handful of searches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.mig.model import Product
from fleet.mig.planning import plan_layout
from fleet.mig.rules import Instance


@dataclass(frozen=True)
class ProfileCapacity:
    """What one GPU offers a profile.

    Attributes:
        fits_now: its idle instances of the profile, plus the most new instances of it that fit
            in the free memory slices beside every current instance.
        fits_if_idle_reshaped: the most instances of it that fit beside the busy instances alone
            (every idle instance destroyed first, as a layout change needs).
    """

    fits_now: int
    fits_if_idle_reshaped: int


def max_new_instances(
    product: Product, profile_ref: int | str, existing: Sequence[Instance]
) -> int:
    """The largest number of new instances of a profile that fit beside ``existing``.

    What repeated ``nvidia-smi mig -cgi <profile>`` calls could create at best, with every
    instance placed where :func:`fleet.mig.planning.plan_layout` puts it (the count is monotone:
    if ``k + 1`` fit, ``k`` fit).

    Args:
        product: the GPU product (with agent-reported placements where known).
        profile_ref: the profile (id, or name as :meth:`Product.profile` accepts).
        existing: the instances kept where they are; an invalid layout leaves no room.

    Returns:
        The count; 0 for an unknown profile or a product without MIG.
    """
    profile = product.profile(profile_ref)
    if profile is None or not product.mig_capable:
        return 0
    count = 0
    while (
        count < product.max_instances
        and plan_layout(product, [profile.id] * (count + 1), existing).fits
    ):
        count += 1
    return count


def profile_capacity(
    product: Product,
    profile_ref: int | str,
    busy: Sequence[Instance],
    idle: Sequence[Instance],
) -> ProfileCapacity:
    """What a GPU with ``busy`` (allocated) and ``idle`` instances offers a profile.

    Args:
        product: the GPU product.
        profile_ref: the profile (id or name).
        busy: instances that hold a replica; they stay.
        idle: instances that hold none; they may be used as they are, or destroyed by a reshape.

    Returns:
        The counts; zeros for a profile the product does not know.
    """
    profile = product.profile(profile_ref)
    if profile is None:
        return ProfileCapacity(0, 0)
    free = sum(1 for instance in idle if instance.profile_id == profile.id)
    return ProfileCapacity(
        fits_now=free + max_new_instances(product, profile.id, (*busy, *idle)),
        fits_if_idle_reshaped=max_new_instances(product, profile.id, busy),
    )
