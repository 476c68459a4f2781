"""The short text form of a layout: ``3g.20gb@4,1g.5gb@0`` (profile ``@`` start slice).

Used by command-line tools and forms; profiles may be names or ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.mig.model import Product
from fleet.mig.planning import UnknownProfileError
from fleet.mig.rules import Instance, instance_sort_key


class NotationError(ValueError):
    """Text that is not a list of ``profile@start`` items."""


def parse_instances(product: Product, text: str) -> tuple[Instance, ...]:
    """Parses ``"3g.20gb@4,1g.5gb@0"`` into instances, in the order written.

    Args:
        product: the product whose profile names and ids are accepted.
        text: comma-separated ``<profile>@<start>`` items; blanks are ignored.

    Returns:
        The instances (not validated: see :func:`fleet.mig.rules.validate_layout`).

    Raises:
        NotationError: an item is not ``<profile>@<start>`` with a whole-number start.
        UnknownProfileError: the product has no such profile.
    """
    instances = []
    for item in (part.strip() for part in text.split(",")):
        ref, at, start = item.rpartition("@")
        if not item or not at or not ref.strip() or not start.strip().isdecimal():
            raise NotationError(
                f"{item!r} is not <profile>@<start>, e.g. '3g.20gb@4' (in {text!r})."
            )
        profile = product.profile(ref.strip())
        if profile is None:
            raise UnknownProfileError(product, ref.strip())
        instances.append(Instance(profile.id, int(start)))
    return tuple(instances)


def format_instances(product: Product, instances: Sequence[Instance]) -> str:
    """The text form of a layout, by start; unknown profiles are written as their id."""
    items = []
    for instance in sorted(instances, key=instance_sort_key):
        profile = product.profile(instance.profile_id)
        label = profile.name if profile is not None else str(instance.profile_id)
        items.append(f"{label}@{instance.start}")
    return ",".join(items)
