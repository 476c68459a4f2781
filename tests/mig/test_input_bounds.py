"""Bounds on user input to the pure MIG code: mig-parted documents and wanted profile lists are
refused by their size before any work that grows with it (security review H2)."""

from __future__ import annotations

import pytest

from fleet.domain import Violation
from fleet.mig import (
    MEDIA_EXTENSION_LIMIT,
    TOO_MANY_INSTANCES,
    MigConfigSpec,
    MigPartedError,
    migparted_to_layout,
    parse_migparted,
    plan_layout,
)
from fleet.mig.migparted.parse import (
    MAX_CONFIGS,
    MAX_COUNT,
    MAX_DEVICES,
    MAX_ENTRIES,
    MAX_PROFILES,
    MAX_TEXT_CHARS,
)
from tests.mig.conftest import product

ENTRY = "{devices: all, mig-enabled: false}"


def _document(configs: str) -> str:
    return f"version: v1\nmig-configs:\n{configs}"


def _codes(result: tuple[object, ...]) -> list[str]:
    return [v.code for v in result if isinstance(v, Violation)]


def test_no_gpu_holds_more_instances_than_the_parse_bound():
    assert MAX_COUNT == 7


def test_a_count_no_gpu_can_hold_is_refused_while_parsing():
    text = _document(
        '  x:\n    - {devices: all, mig-enabled: true, mig-devices: {"1g.10gb+me": 20000}}\n'
    )
    with pytest.raises(MigPartedError, match=r"20000 instances of '1g\.10gb\+me'") as caught:
        parse_migparted(text)
    assert caught.value.details == {
        "config": "x",
        "entry": 0,
        "profile": "1g.10gb+me",
        "count": 20000,
        "max_count": 7,
    }


def test_a_huge_count_made_in_code_is_one_violation_built_from_the_number():
    spec = MigConfigSpec("all", True, (("1g.10gb+me", 10**12),))
    (violation,) = migparted_to_layout(product("h100-sxm5-80gb"), spec)
    assert isinstance(violation, Violation) and violation.code == TOO_MANY_INSTANCES
    assert violation.details == {"count": 10**12, "max_instances": 7}


def test_a_count_within_any_gpu_but_above_this_product_is_a_violation():
    config = parse_migparted(
        _document("  x:\n    - {devices: all, mig-enabled: true, mig-devices: {1g.6gb: 5}}\n")
    )
    (spec,) = config.config("x") or ()
    assert _codes(migparted_to_layout(product("a30-24gb"), spec)) == [TOO_MANY_INSTANCES]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_document("  a: [&e " + ENTRY + "]\n  b: [*e]\n"), "anchors and aliases"),
        (_document("  a: [&e " + ENTRY + "]\n"), "anchors and aliases"),
        (
            _document("  a:\n    - &base {devices: all}\n    - {<<: *base, mig-enabled: false}\n"),
            "anchors",
        ),
    ],
)
def test_yaml_anchors_and_aliases_are_refused(text, message):
    with pytest.raises(MigPartedError, match=message):
        parse_migparted(text)


def test_an_alias_bomb_is_refused_before_it_is_expanded():
    layers = ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
    layers += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    with pytest.raises(MigPartedError, match="anchors and aliases"):
        parse_migparted("\n".join(layers) + "\nversion: v1\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("#" * (MAX_TEXT_CHARS + 1), f"at most {MAX_TEXT_CHARS}"),
        (
            _document("".join(f"  c{i}: [{ENTRY}]\n" for i in range(MAX_CONFIGS + 1))),
            f"{MAX_CONFIGS + 1} configs; at most {MAX_CONFIGS}",
        ),
        (
            _document("  c: [" + ", ".join([ENTRY] * (MAX_ENTRIES + 1)) + "]\n"),
            f"{MAX_ENTRIES + 1} entries; at most {MAX_ENTRIES}",
        ),
        (
            _document(f"  c: [{{devices: {list(range(MAX_DEVICES + 1))}, mig-enabled: false}}]\n"),
            f"{MAX_DEVICES + 1} GPUs; at most {MAX_DEVICES}",
        ),
        (
            _document(
                "  c: [{devices: all, mig-enabled: true, mig-devices: {"
                + ", ".join(f"{i + 1}g.{i + 1}gb: 1" for i in range(MAX_PROFILES + 1))
                + "}}]\n"
            ),
            f"{MAX_PROFILES + 1} profiles; at most {MAX_PROFILES}",
        ),
    ],
)
def test_documents_past_a_bound_are_refused_with_the_bound(text, message):
    with pytest.raises(MigPartedError, match=message):
        parse_migparted(text)


def test_deeply_nested_yaml_is_refused_as_invalid():
    with pytest.raises(MigPartedError, match="Not valid YAML"):
        parse_migparted("version: v1\nmig-configs: " + "[" * 5000 + "]" * 5000 + "\n")


def test_planning_more_profiles_than_the_gpu_holds_is_refused_without_pairwise_work():
    plan = plan_layout(product("h100-sxm5-80gb"), ["1g.10gb+me"] * 2000)
    assert _codes(plan.violations) == [TOO_MANY_INSTANCES]  # not one violation per pair


def test_the_media_rule_is_reported_once_however_many_instances_break_it():
    plan = plan_layout(product("a100-sxm4-40gb"), ["1g.5gb+me"] * 3 + ["1g.5gb"])
    (media,) = [v for v in plan.violations if v.code == MEDIA_EXTENSION_LIMIT]
    assert media.details == {"first": "1g.5gb+me", "second": "1g.5gb+me", "profiles": ["1g.5gb+me"]}
