"""Writing mig-parted files and converting them: a config rendered as YAML, a layout exported as
one config's profile counts, and a config entry's counts turned into placements on one GPU
(:func:`fleet.mig.planning.plan_layout`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from fleet.domain import Violation
from fleet.mig.migparted.spec import (
    MigConfigSpec,
    MigPartedConfig,
    MigPartedError,
    device_filter_id,
)
from fleet.mig.model import Product
from fleet.mig.planning import plan_layout, too_many_instances
from fleet.mig.rules import (
    DEVICE_FILTER_MISMATCH,
    NOT_SUPPORTED,
    Instance,
    resolve,
    unknown_profile,
    validate_layout,
)


def render_migparted(config: MigPartedConfig) -> str:
    """The config as mig-parted YAML (``nvidia-mig-parted export`` style); parses back equal."""
    document = {
        "version": config.version,
        "mig-configs": {
            name: [_render_spec(spec) for spec in entries] for name, entries in config.mig_configs
        },
    }
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def _render_spec(spec: MigConfigSpec) -> dict[str, Any]:
    rendered: dict[str, Any] = {}
    if spec.device_filter:
        rendered["device-filter"] = list(spec.device_filter)
    rendered["devices"] = spec.devices if isinstance(spec.devices, str) else list(spec.devices)
    rendered["mig-enabled"] = spec.mig_enabled
    if spec.mig_enabled:
        rendered["mig-devices"] = dict(spec.mig_devices)
    return rendered


def layout_to_migparted(
    product: Product,
    instances: Sequence[Instance],
    *,
    config_name: str,
    devices: str | Sequence[int] = "all",
) -> MigPartedConfig:
    """A one-config mig-parted file that recreates a layout's profile counts on this product.

    Placements are lost: mig-parted only stores counts. Profiles are listed largest first.

    Args:
        product: the GPU product; its PCI ids become the entry's device filter.
        instances: the layout (must be valid).
        config_name: the name ``nvidia-mig-parted apply -c`` would select.
        devices: ``"all"`` or GPU indices.

    Returns:
        The config.

    Raises:
        MigPartedError: the layout is invalid or the product has no MIG (details list violations).
    """
    violations = validate_layout(product, instances)
    if not product.mig_capable:
        violations = (Violation(NOT_SUPPORTED, f"{product.name} does not support MIG.", {}),)
    if violations:
        raise MigPartedError(
            f"Cannot export this layout for {product.name}.",
            {"violations": [v.as_dict() for v in violations], "product": product.key},
        )
    counts: dict[str, int] = {}
    placed = resolve(product, instances)
    for profile in product.profiles:
        count = sum(1 for p, _ in placed if p.id == profile.id)
        if count:
            counts[profile.name] = count
    spec = MigConfigSpec(
        devices=devices if isinstance(devices, str) else tuple(devices),
        mig_enabled=True,
        mig_devices=tuple(counts.items()),
        device_filter=tuple(device_filter_id(d) for d in product.pci_device_ids),
    )
    return MigPartedConfig(((config_name, (spec,)),))


def migparted_to_layout(
    product: Product, spec: MigConfigSpec, *, existing: Sequence[Instance] = ()
) -> tuple[Instance, ...] | tuple[Violation, ...]:
    """Placements for a mig-parted entry's counts on one GPU of this product.

    Args:
        product: the GPU product.
        spec: one entry of a config.
        existing: instances to keep (usually none: ``apply`` recreates everything).

    Returns:
        The new instances by start (empty for a MIG-disabled or empty entry), or the violations
        (``mig.device_filter_mismatch``, ``mig.unknown_profile``, ``mig.not_supported``,
        ``mig.does_not_fit``, ...) when the entry cannot be applied.
    """
    if not spec.applies_to(product):
        return (
            Violation(
                DEVICE_FILTER_MISMATCH,
                f"The entry's device filter does not select {product.name}.",
                {"device_filter": list(spec.device_filter), "product": product.key},
            ),
        )
    if not spec.mig_enabled:
        return ()
    if not product.mig_capable:
        return (Violation(NOT_SUPPORTED, f"{product.name} does not support MIG.", {}),)
    # Counted before the list of instances is built: a spec made in code has no parse bounds.
    too_many = too_many_instances(product, sum(count for _, count in spec.mig_devices))
    if too_many is not None:
        return (too_many,)
    wanted: list[int | str] = []
    unknown = []
    for name, count in spec.mig_devices:
        profile = product.profile(name)
        if profile is None:
            unknown.append(unknown_profile(product, name))
        else:
            wanted += [profile.id] * count
    if unknown:
        return tuple(unknown)
    plan = plan_layout(product, wanted, existing)
    return plan.instances if plan.fits else plan.violations
