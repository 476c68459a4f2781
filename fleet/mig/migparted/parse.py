"""Reading a mig-parted file: bounded before any work (text length, configs, entries, devices,
profiles, counts), YAML anchors and aliases refused, and validated against the v1 schema as
``nvidia-mig-parted apply -f`` does."""

from __future__ import annotations

import re
from collections.abc import Sized
from itertools import accumulate
from typing import Any

import yaml

from fleet.mig.catalog import PRODUCTS
from fleet.mig.migparted.spec import SPEC_VERSION, MigConfigSpec, MigPartedConfig, MigPartedError

# go-nvlib's profile grammar: <g>g.<gb>gb or <c>c.<g>g.<gb>gb, with an optional attribute (§5.1).
_PROFILE_RE = re.compile(r"^(?:\d+c\.)?\d+g\.\d+gb(?:\+me\.all|\+me|\+gfx|-me)?$")
_FILTER_RE = re.compile(r"^0x[0-9A-F]{8}$")
_SPEC_KEYS = frozenset({"devices", "mig-enabled", "mig-devices", "device-filter"})

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
