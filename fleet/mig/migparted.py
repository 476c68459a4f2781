"""nvidia-mig-parted configuration files (``api/spec/v1``): parse, render, and convert to layouts.

Schema (facts §5.1)::

    version: v1
    mig-configs:
      <config name>:
        - device-filter: ["0x20B010DE"]   # optional, string or list, "0x<DEVICE><VENDOR>"
          devices: all                    # required: "all" or a list of GPU indices
          mig-enabled: true               # required
          mig-devices: {"1g.5gb": 7}      # required when enabled ({} = none); empty when disabled

mig-parted keeps counts, not placements: ``nvidia-mig-parted apply`` recreates every instance and
lets the driver place them. :func:`migparted_to_layout` chooses placements with
:func:`fleet.mig.planning.plan_layout` instead.

Documents come from users, so their size is bounded before any work: the text length, the number
of configs, entries, devices and profiles, and each count (no GPU holds more than
:data:`MAX_COUNT` instances). YAML anchors and aliases are refused: an alias lets a short text
stand for a huge document.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import yaml

from fleet.domain import Violation
from fleet.mig.catalog import PRODUCTS
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

SPEC_VERSION = "v1"

# go-nvlib's profile grammar: <g>g.<gb>gb or <c>c.<g>g.<gb>gb, with an optional attribute (§5.1).
_PROFILE_RE = re.compile(r"^(?:\d+c\.)?\d+g\.\d+gb(?:\+me\.all|\+me|\+gfx|-me)?$")
_FILTER_RE = re.compile(r"^0x[0-9A-F]{8}$")
_SPEC_KEYS = frozenset({"devices", "mig-enabled", "mig-devices", "device-filter"})
_NVIDIA_VENDOR = "10DE"

# Bounds on a document. NVIDIA's own default config (deployments/systemd/config-default.yaml) is
# about 9.5 KB with 70 configs of at most 10 entries, so these leave ample room.
MAX_TEXT_CHARS = 65_536
MAX_CONFIGS = 256
MAX_ENTRIES = 64
MAX_DEVICES = 64
MAX_PROFILES = 32
MAX_COUNT = max(product.max_instances for product in PRODUCTS)

# libyaml when the wheel has it: about five times faster than the pure-Python parser.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MAX_SLOW_FLOW_DEPTH = 32
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_NESTING = {"[": 1, "{": 1, "]": -1, "}": -1}


class MigPartedError(ValueError):
    """A mig-parted document that does not follow the v1 schema.

    Attributes:
        message: what is wrong, for people.
        details: where (config name, entry index, key).
    """

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = dict(details or {})


@dataclass(frozen=True)
class MigConfigSpec:
    """One entry of a named config (Go ``MigConfigSpec``).

    Attributes:
        devices: ``"all"`` or GPU indices.
        mig_enabled: whether MIG mode is on for these GPUs.
        mig_devices: (profile name, count) pairs in document order.
        device_filter: ``0x<DEVICE><VENDOR>`` ids (upper-case hex) the entry applies to;
            empty means any GPU.
    """

    devices: str | tuple[int, ...] = "all"
    mig_enabled: bool = True
    mig_devices: tuple[tuple[str, int], ...] = ()
    device_filter: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        """``mig-devices`` as a dict."""
        return dict(self.mig_devices)

    def applies_to(self, product: Product) -> bool:
        """Whether the device filter (if any) matches one of the product's PCI ids."""
        if not self.device_filter:
            return True
        return any(device_filter_id(d) in self.device_filter for d in product.pci_device_ids)


@dataclass(frozen=True)
class MigPartedConfig:
    """A whole mig-parted file (Go ``Spec``).

    Attributes:
        mig_configs: (config name, entries) pairs in document order.
        version: always ``v1``.
    """

    mig_configs: tuple[tuple[str, tuple[MigConfigSpec, ...]], ...]
    version: str = SPEC_VERSION

    def config(self, name: str) -> tuple[MigConfigSpec, ...] | None:
        """The entries of a named config (what ``nvidia-mig-parted apply -c <name>`` selects)."""
        return dict(self.mig_configs).get(name)


def device_filter_id(pci_device_id: int) -> str:
    """The mig-parted form of a 16-bit device id: ``0x20B0`` -> ``"0x20B010DE"``."""
    return f"0x{pci_device_id:04X}{_NVIDIA_VENDOR}"


def parse_migparted(text: str) -> MigPartedConfig:
    """Parses and validates a mig-parted config file, as ``nvidia-mig-parted apply -f`` does.

    Args:
        text: the YAML (or JSON) document.

    Returns:
        The config.

    Raises:
        MigPartedError: bad YAML, unknown version, a missing or unknown key, a wrong type,
            ``mig-devices`` on a MIG-disabled entry, a malformed profile or device filter, YAML
            anchors or aliases, or a document past one of the bounds (``MAX_*``).
    """
    if len(text) > MAX_TEXT_CHARS:
        raise MigPartedError(
            f"The config is {len(text)} characters long; at most {MAX_TEXT_CHARS} are accepted.",
            {"max_chars": MAX_TEXT_CHARS},
        )
    document = _load(text)
    if not isinstance(document, dict):
        raise MigPartedError(
            "A mig-parted config must be a mapping with 'version' and 'mig-configs'."
        )
    extra = sorted(map(str, set(document) - {"version", "mig-configs"}))
    if extra:
        raise MigPartedError(f"Unknown top-level keys: {', '.join(extra)}.", {"keys": extra})
    if "version" not in document:
        raise MigPartedError("Missing required key 'version'.", {"key": "version"})
    if document["version"] != SPEC_VERSION:
        raise MigPartedError(
            f"Unknown version {document['version']!r}; only {SPEC_VERSION!r} is supported.",
            {"version": document["version"]},
        )
    configs = document.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise MigPartedError("'mig-configs' must be a non-empty mapping of config names.")
    _check_length(configs, MAX_CONFIGS, "'mig-configs' has {n} configs", {})
    return MigPartedConfig(
        tuple((str(name), _parse_entries(str(name), entries)) for name, entries in configs.items())
    )


# A YAML escape of one half of a UTF-16 surrogate pair: YAML reads "\ud83d\ude00" as two lone
# halves, not one character, and no answer quoting them could be encoded.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _load(text: str) -> Any:
    """The YAML document, refused at its first anchor or alias, before it is built."""
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        raise MigPartedError(
            "Not valid YAML here: a \\uD800-\\uDFFF escape is half of a UTF-16 pair; write the "
            "character itself (or \\U0001F600 style).",
            {},
        )
    try:
        try:
            return _load_with(text, _FAST_LOADER)
        except yaml.YAMLError:
            # libyaml refuses a few documents PyYAML reads (``{mig-devices:}``), so PyYAML has
            # the last word, except on deep flow nesting, which takes it seconds to refuse.
            if _FAST_LOADER is yaml.SafeLoader or _flow_depth(text) > _MAX_SLOW_FLOW_DEPTH:
                raise
            return _load_with(text, yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise MigPartedError(f"Not valid YAML: {exc}", {}) from exc
    except RecursionError:  # the pure-Python composer recurses once per nesting level
        raise MigPartedError("Not valid YAML: nested too deeply.", {}) from None


def _load_with(text: str, loader: Any) -> Any:
    # An anchor or alias needs "&" or "*": most files have neither and are parsed once.
    events = yaml.parse(text, Loader=loader) if "&" in text or "*" in text else ()
    for event in events:
        if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            raise MigPartedError(
                "YAML anchors and aliases (&name, *name, <<) are not accepted; "
                "write every entry out.",
                {"line": event.start_mark.line + 1 if event.start_mark else None},
            )
    return yaml.load(text, Loader=loader)  # a safe loader (CSafeLoader or SafeLoader)


def _flow_depth(text: str) -> int:
    """How deeply ``[`` and ``{`` nest; an estimate (brackets in strings and comments count)."""
    brackets = _NOT_BRACKETS.sub("", text)
    return max(accumulate(_NESTING[c] for c in brackets), default=0)


def _check_length(items: Sized, limit: int, what: str, where: dict[str, Any]) -> None:
    if len(items) > limit:
        message = what.format(n=len(items)) + f"; at most {limit} are accepted."
        raise MigPartedError(message, {**where, "limit": limit})


def _parse_entries(name: str, entries: object) -> tuple[MigConfigSpec, ...]:
    if not isinstance(entries, list) or not entries:
        raise MigPartedError(
            f"Config {name!r} must be a non-empty list of entries.", {"config": name}
        )
    _check_length(entries, MAX_ENTRIES, f"Config {name!r} has {{n}} entries", {"config": name})
    return tuple(
        _parse_spec(entry, {"config": name, "entry": i}) for i, entry in enumerate(entries)
    )


def _parse_spec(entry: object, where: dict[str, Any]) -> MigConfigSpec:
    at = f"config {where['config']!r} entry {where['entry']}"
    if not isinstance(entry, dict):
        raise MigPartedError(f"In {at}: an entry must be a mapping.", where)
    extra = sorted(map(str, set(entry) - _SPEC_KEYS))
    if extra:
        raise MigPartedError(f"In {at}: unknown keys {', '.join(extra)}.", {**where, "keys": extra})
    for key in ("devices", "mig-enabled"):
        if key not in entry:
            raise MigPartedError(f"In {at}: missing required key {key!r}.", {**where, "key": key})
    enabled = entry["mig-enabled"]
    if not isinstance(enabled, bool):
        raise MigPartedError(f"In {at}: 'mig-enabled' must be true or false.", where)
    return MigConfigSpec(
        devices=_parse_devices(entry["devices"], at, where),
        mig_enabled=enabled,
        mig_devices=_parse_mig_devices(entry, enabled, at, where),
        device_filter=_parse_filter(entry.get("device-filter"), at, where),
    )


def _parse_devices(devices: object, at: str, where: dict[str, Any]) -> str | tuple[int, ...]:
    if devices == "all":
        return "all"
    if isinstance(devices, list):
        _check_length(devices, MAX_DEVICES, f"In {at}: 'devices' lists {{n}} GPUs", where)
    if (
        isinstance(devices, list)
        and devices
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)
    ):
        return tuple(devices)
    raise MigPartedError(f"In {at}: 'devices' must be 'all' or a list of GPU indices.", where)


def _parse_mig_devices(
    entry: dict[Any, Any], enabled: bool, at: str, where: dict[str, Any]
) -> tuple[tuple[str, int], ...]:
    if "mig-devices" not in entry:
        if enabled:
            raise MigPartedError(
                f"In {at}: 'mig-devices' is required when MIG is enabled (use {{}} for none).",
                {**where, "key": "mig-devices"},
            )
        return ()
    devices = entry["mig-devices"]
    if devices is None:
        devices = {}
    if not isinstance(devices, dict):
        raise MigPartedError(f"In {at}: 'mig-devices' must map profiles to counts.", where)
    if devices and not enabled:
        raise MigPartedError(f"In {at}: 'mig-devices' must be empty when MIG is disabled.", where)
    _check_length(devices, MAX_PROFILES, f"In {at}: 'mig-devices' names {{n}} profiles", where)
    pairs = []
    for profile, count in devices.items():
        if not isinstance(profile, str) or not _PROFILE_RE.match(profile):
            raise MigPartedError(
                f"In {at}: {profile!r} is not a MIG profile like '1g.5gb', '1c.3g.20gb' or "
                "'1g.10gb+me'.",
                {**where, "profile": str(profile)},
            )
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise MigPartedError(
                f"In {at}: the count of {profile!r} must be a whole number >= 0.",
                {**where, "profile": profile},
            )
        if count > MAX_COUNT:
            raise MigPartedError(
                f"In {at}: {count} instances of {profile!r}; no GPU holds more than {MAX_COUNT}.",
                {**where, "profile": profile, "count": count, "max_count": MAX_COUNT},
            )
        pairs.append((profile, count))
    return tuple(pairs)


def _parse_filter(value: object, at: str, where: dict[str, Any]) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    filters = []
    for item in items:
        normalized = _normalize_filter(item)
        if not _FILTER_RE.match(normalized):
            raise MigPartedError(
                f"In {at}: device filter {item!r} is not of the form '0x<DEVICE><VENDOR>' "
                "(e.g. '0x20B010DE').",
                {**where, "device_filter": str(item)},
            )
        filters.append(normalized)
    return tuple(filters)


def _normalize_filter(item: object) -> str:
    # Unquoted 0x20B010DE is a YAML 1.1 integer; accept it as the id it spells, but not a bare
    # 16-bit device id such as 0x20B0 (the vendor half is missing).
    if isinstance(item, int) and not isinstance(item, bool) and item > 0xFFFF:
        return f"0x{item:08X}"
    if isinstance(item, str) and item[:2].lower() == "0x":
        return "0x" + item[2:].upper()
    return ""


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
