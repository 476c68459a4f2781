"""A mig-parted config as the layouts of a rollout: each selected GPU takes the layout of the
config's entry that selects it (``devices``: ``all`` or GPU indexes on the host, and the
``device-filter`` of PCI ids, matched against the GPU's product).

mig-parted keeps counts, not placements; placements come from :func:`fleet.mig.migparted_to_layout`,
except where the GPU already has the entry's counts: then its layout is left as it is (mig-parted
would recreate the same instances). An entry with ``mig-enabled: false`` makes the GPU dedicated.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from fleet.allocations.layout_rollouts import MAX_GPUS, Selector, selected_gpus
from fleet.core.errors import ServiceError
from fleet.domain import Violation
from fleet.inventory.models import Gpu
from fleet.mig import MigConfigSpec, MigPartedError, Product, migparted_to_layout, parse_migparted
from fleet.partitioning import converters
from fleet.partitioning.selectors import current_layout
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec

INVALID = "rollout.migparted_invalid"


def _text(config: str | Mapping[str, Any]) -> str:
    if isinstance(config, str):
        return config
    # JSON is YAML: one parser, one set of bounds. Characters as themselves: YAML's \\u escapes
    # do not pair surrogates, so an escaped astral character would come back as two halves.
    return json.dumps(config, ensure_ascii=False)


def migparted_layouts(
    *, selector: Selector, config: str | Mapping[str, Any], name: str
) -> dict[int, LayoutSpec]:
    """Each selected GPU's layout from the config named ``name``.

    Raises:
        ServiceError: ``rollout.migparted_invalid`` (the document, or an entry that does not fit
            a GPU, with the rule violations), ``rollout.migparted_unknown_config``,
            ``rollout.migparted_no_entry`` (a selected GPU no entry selects) or
            ``rollout.migparted_ambiguous`` (two entries select one GPU).
    """
    try:
        parsed = parse_migparted(_text(config))
    except MigPartedError as error:
        raise ServiceError(INVALID, error.message, error.details) from None
    entries = parsed.config(name)
    if entries is None:
        names = [n for n, _ in parsed.mig_configs]
        raise ServiceError(
            "rollout.migparted_unknown_config",
            f"The config has no entry named {name!r}; it has: {', '.join(names[:20])}.",
            {"name": name, "configs": names[:100]},
        )
    layouts: dict[int, LayoutSpec] = {}
    for gpu in selected_gpus(selector)[: MAX_GPUS + 1]:
        layouts[gpu.pk] = _gpu_layout(gpu, name, entries)
    return layouts


def _gpu_layout(gpu: Gpu, name: str, entries: tuple[MigConfigSpec, ...]) -> LayoutSpec:
    product = converters.product_of(gpu)
    if product is None:
        raise ServiceError(
            INVALID,
            f"{gpu}: {gpu.product_name!r} is not in the MIG catalog.",
            {"gpu": gpu.pk, "product": gpu.product_name},
        )
    matching = [
        index
        for index, entry in enumerate(entries)
        if (entry.devices == "all" or gpu.index in entry.devices) and entry.applies_to(product)
    ]
    if not matching:
        raise ServiceError(
            "rollout.migparted_no_entry",
            f"{gpu}: no entry of config {name!r} selects GPU index {gpu.index} of {product.name}.",
            {"gpu": gpu.pk, "index": gpu.index, "product": product.key, "config": name},
        )
    if len(matching) > 1:
        raise ServiceError(
            "rollout.migparted_ambiguous",
            f"{gpu}: entries {', '.join(map(str, matching))} of config {name!r} all select GPU "
            f"index {gpu.index}; give each GPU one entry.",
            {"gpu": gpu.pk, "index": gpu.index, "entries": matching, "config": name},
        )
    return _entry_layout(gpu, product, entries[matching[0]], matching[0])


def _entry_layout(gpu: Gpu, product: Product, entry: MigConfigSpec, index: int) -> LayoutSpec:
    if not entry.mig_enabled:
        return LayoutSpec(mode="dedicated")
    now = current_layout(gpu)
    counts = _counts(product, now) if now.mode == "mig" else None
    if counts is not None and counts == _wanted(product, entry):
        return now
    found = migparted_to_layout(product, entry)
    if found and isinstance(found[0], Violation):
        violations = [v.as_dict() for v in found if isinstance(v, Violation)]
        raise ServiceError(
            INVALID,
            f"{gpu}: entry {index} does not fit {product.name}: {violations[0]['message']}",
            {"gpu": gpu.pk, "entry": index, "violations": violations},
        )
    instances = tuple(
        MigInstanceSpec(i.profile_id, i.start) for i in found if not isinstance(i, Violation)
    )
    return LayoutSpec(mode="mig", instances=instances)


def _counts(product: Product, layout: LayoutSpec) -> Counter[int] | None:
    found: Counter[int] = Counter()
    for instance in layout.instances:
        profile = product.profile(instance.profile)
        if profile is None:
            return None
        found[profile.id] += 1
    return found


def _wanted(product: Product, entry: MigConfigSpec) -> Counter[int] | None:
    found: Counter[int] = Counter()
    for profile_name, count in entry.mig_devices:
        profile = product.profile(profile_name)
        if profile is None:
            return None
        if count:
            found[profile.id] += count
    return found
