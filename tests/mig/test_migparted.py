"""nvidia-mig-parted files: schema errors, round trips, and conversion to and from layouts."""

from __future__ import annotations

import pytest

from fleet.domain import Violation
from fleet.mig import (
    DEVICE_FILTER_MISMATCH,
    DOES_NOT_FIT,
    NOT_SUPPORTED,
    UNKNOWN_PROFILE,
    Instance,
    MigConfigSpec,
    MigPartedConfig,
    MigPartedError,
    device_filter_id,
    layout_to_migparted,
    migparted_to_layout,
    parse_migparted,
    render_migparted,
    suggest_layout,
)

DEFAULT_EXCERPT = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}
  all-1g.10gb:
    - device-filter: ["0x233010DE", "0x233110DE", "0x20B210DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
    - device-filter: ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 4
  custom:
    - device-filter: "0x20b010de"
      devices: [0, 1]
      mig-enabled: true
      mig-devices:
        "3g.20gb": 1
        "2g.10gb": 1
        "1g.5gb+me": 1
        "1c.3g.20gb": 0
"""


def test_the_shipped_default_config_parses():
    config = parse_migparted(DEFAULT_EXCERPT)
    assert [name for name, _ in config.mig_configs] == [
        "all-disabled",
        "all-enabled",
        "all-1g.10gb",
        "custom",
    ]
    assert config.config("all-disabled") == (MigConfigSpec("all", False),)
    assert config.config("all-enabled") == (MigConfigSpec("all", True),)
    (h100, a100) = config.config("all-1g.10gb") or ()
    assert h100.counts() == {"1g.10gb": 7}
    assert a100.device_filter == ("0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE")
    (custom,) = config.config("custom") or ()
    assert custom.devices == (0, 1)
    assert custom.device_filter == ("0x20B010DE",)
    assert config.config("missing") is None


def test_rendering_parses_back_to_the_same_config():
    config = parse_migparted(DEFAULT_EXCERPT)
    assert parse_migparted(render_migparted(config)) == config


def test_rendering_writes_the_mig_parted_keys():
    text = render_migparted(parse_migparted(DEFAULT_EXCERPT))
    assert text.startswith("version: v1\nmig-configs:\n")
    assert "mig-enabled: false" in text
    assert "device-filter:" in text
    assert "mig-devices: {}" in text


def test_an_unquoted_hex_device_filter_is_read_as_the_id_it_spells():
    text = """
version: v1
mig-configs:
  c:
    - device-filter: 0x20B010DE
      devices: all
      mig-enabled: false
"""
    (spec,) = parse_migparted(text).config("c") or ()
    assert spec.device_filter == ("0x20B010DE",)


def test_a_null_mig_devices_on_an_enabled_entry_means_none():
    text = (
        "version: v1\nmig-configs:\n  c:\n    - {devices: all, mig-enabled: true, mig-devices:}\n"
    )
    assert parse_migparted(text).config("c") == (MigConfigSpec("all", True),)


def _entry(body: str) -> str:
    return f"version: v1\nmig-configs:\n  c:\n    - {body}\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v1\nmig-configs: [", "Not valid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        ("mig-configs: {}\n", "Missing required key 'version'"),
        ("version: v2\nmig-configs: {c: []}\n", "Unknown version 'v2'"),
        ("version: v1\nextra: 1\n7: 1\nmig-configs: {}\n", "Unknown top-level keys: 7, extra"),
        ("version: v1\n", "'mig-configs' must be a non-empty mapping"),
        ("version: v1\nmig-configs: {}\n", "'mig-configs' must be a non-empty mapping"),
        ("version: v1\nmig-configs: {c: []}\n", "Config 'c' must be a non-empty list"),
        ("version: v1\nmig-configs: {c: [all]}\n", "an entry must be a mapping"),
        (_entry("{mig-enabled: false}"), "missing required key 'devices'"),
        (_entry("{devices: all}"), "missing required key 'mig-enabled'"),
        (_entry("{devices: all, mig-enabled: yes please}"), "'mig-enabled' must be true or false"),
        (_entry("{devices: some, mig-enabled: false}"), "'devices' must be 'all' or a list"),
        (_entry("{devices: [], mig-enabled: false}"), "'devices' must be 'all' or a list"),
        (_entry("{devices: [-1], mig-enabled: false}"), "'devices' must be 'all' or a list"),
        (_entry("{devices: [true], mig-enabled: false}"), "'devices' must be 'all' or a list"),
        (_entry("{devices: all, mig-enabled: true}"), "'mig-devices' is required"),
        (
            _entry("{devices: all, mig-enabled: false, mig-devices: {1g.5gb: 1}}"),
            "'mig-devices' must be empty when MIG is disabled",
        ),
        (_entry("{devices: all, mig-enabled: true, mig-devices: [1]}"), "must map profiles"),
        (_entry("{devices: all, mig-enabled: true, mig-devices: {1g.5g: 1}}"), "not a MIG profile"),
        (_entry("{devices: all, mig-enabled: true, mig-devices: {7: 1}}"), "not a MIG profile"),
        (_entry("{devices: all, mig-enabled: true, mig-devices: {1g.5gb: -1}}"), "whole number"),
        (_entry("{devices: all, mig-enabled: true, mig-devices: {1g.5gb: x}}"), "whole number"),
        (_entry("{devices: all, mig-enabled: true, mig-devices: {1g.5gb: true}}"), "whole number"),
        (_entry("{devices: all, mig-enabled: false, colour: red}"), "unknown keys colour"),
        (_entry("{devices: all, mig-enabled: false, device-filter: 20B0}"), "device filter"),
        (_entry("{devices: all, mig-enabled: false, device-filter: [0x20B0]}"), "device filter"),
        (_entry("{devices: all, mig-enabled: false, device-filter: [true]}"), "device filter"),
    ],
)
def test_schema_errors_say_what_is_wrong(text, message):
    with pytest.raises(MigPartedError, match=message.replace("[", r"\[")) as caught:
        parse_migparted(text)
    assert caught.value.message == str(caught.value)


def test_schema_errors_say_where():
    with pytest.raises(MigPartedError) as caught:
        parse_migparted(_entry("{devices: all}"))
    assert caught.value.details == {"config": "c", "entry": 0, "key": "mig-enabled"}


def test_a_layout_exports_its_counts_and_the_products_device_filter(a100):
    instances = [Instance(19, 0), Instance(19, 1), Instance(14, 2), Instance(9, 4)]
    config = layout_to_migparted(a100, instances, config_name="balanced", devices=[0, 2])
    (spec,) = config.config("balanced") or ()
    assert spec == MigConfigSpec(
        devices=(0, 2),
        mig_enabled=True,
        mig_devices=(("3g.20gb", 1), ("2g.10gb", 1), ("1g.5gb", 2)),
        device_filter=("0x20B010DE",),
    )
    assert parse_migparted(render_migparted(config)) == config


def test_an_exported_layout_comes_back_with_valid_placements(a100):
    instances = (Instance(19, 0), Instance(19, 1), Instance(14, 2), Instance(9, 4))
    config = layout_to_migparted(a100, instances, config_name="balanced")
    (spec,) = config.config("balanced") or ()
    assert migparted_to_layout(a100, spec) == instances


def test_an_empty_layout_exports_as_mig_enabled_without_devices(a100):
    config = layout_to_migparted(a100, [], config_name="empty")
    assert config == MigPartedConfig(
        (("empty", (MigConfigSpec("all", True, (), ("0x20B010DE",)),)),)
    )


def test_an_invalid_layout_or_a_gpu_without_mig_cannot_be_exported(a100, l4):
    with pytest.raises(MigPartedError) as caught:
        layout_to_migparted(a100, [Instance(9, 0), Instance(5, 0)], config_name="bad")
    assert caught.value.details["violations"][0]["code"] == "mig.overlap"
    with pytest.raises(MigPartedError) as caught:
        layout_to_migparted(l4, [], config_name="bad")
    assert caught.value.details["violations"][0]["code"] == NOT_SUPPORTED


def test_device_filters_use_the_combined_device_and_vendor_id():
    assert device_filter_id(0x20B0) == "0x20B010DE"
    assert device_filter_id(0x2BB5) == "0x2BB510DE"


def test_an_entry_for_another_product_is_a_device_filter_mismatch(a100):
    spec = MigConfigSpec("all", True, (("1g.10gb", 7),), ("0x233010DE",))
    result = migparted_to_layout(a100, spec)
    assert [v.code for v in result if isinstance(v, Violation)] == [DEVICE_FILTER_MISMATCH]


def test_a_disabled_entry_has_no_instances(a100, l4):
    assert migparted_to_layout(a100, MigConfigSpec("all", False)) == ()
    assert migparted_to_layout(l4, MigConfigSpec("all", False)) == ()


def test_enabling_mig_on_a_gpu_without_it_is_not_supported(l4):
    result = migparted_to_layout(l4, MigConfigSpec("all", True))
    assert [v.code for v in result if isinstance(v, Violation)] == [NOT_SUPPORTED]


def test_unknown_profiles_in_an_entry_are_reported(a100):
    spec = MigConfigSpec("all", True, (("1g.6gb", 1), ("1g.5gb", 1), ("1c.3g.20gb", 1)))
    result = migparted_to_layout(a100, spec)
    assert [v.code for v in result if isinstance(v, Violation)] == [UNKNOWN_PROFILE] * 2


def test_counts_that_do_not_fit_are_reported(a100):
    spec = MigConfigSpec("all", True, (("3g.20gb", 2), ("1g.5gb", 1)))
    result = migparted_to_layout(a100, spec)
    assert [v.code for v in result if isinstance(v, Violation)] == [DOES_NOT_FIT]


def test_an_entry_keeps_existing_instances_when_asked(a100):
    spec = MigConfigSpec("all", True, (("2g.10gb", 1),), ("0x20B010DE",))
    assert migparted_to_layout(a100, spec, existing=[Instance(9, 4)]) == (Instance(14, 2),)
    assert suggest_layout(a100, [14], [Instance(9, 4)]) == (Instance(14, 2),)


def test_the_default_config_applies_to_each_product_in_its_filter(a100):
    config = parse_migparted(DEFAULT_EXCERPT)
    for spec in config.config("all-1g.10gb") or ():
        result = migparted_to_layout(a100, spec)
        if spec.applies_to(a100):
            assert result == tuple(Instance(15, s) for s in (0, 2, 4, 6))
        else:
            assert [v.code for v in result if isinstance(v, Violation)] == [DEVICE_FILTER_MISMATCH]


def test_a_yaml_escape_of_half_a_surrogate_pair_is_refused_with_a_reason():
    with pytest.raises(MigPartedError, match="UTF-16"):
        parse_migparted('version: v1\nmig-configs:\n  "\\ud835\\udc13": []\n')
