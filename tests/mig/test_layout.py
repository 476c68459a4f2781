"""Layout validation: every rule, every code, and the published layout counts (facts §1.6)."""

from __future__ import annotations

from itertools import combinations

import pytest

from fleet.mig import (
    MEDIA_EXTENSION_LIMIT,
    NOT_SUPPORTED,
    OVERLAP,
    PLACEMENT_NOT_ALLOWED,
    TOO_MANY_INSTANCES,
    UNKNOWN_PROFILE,
    Instance,
    Placement,
    free_placements,
    maximal_layouts,
    occupied_slices,
    valid_layouts,
    validate_layout,
)
from tests.mig.conftest import layout, product
from tests.mig.facts import A30_IDS, A30_MAXIMAL, EIGHT_UNIT_IDS, NINETEEN_MAXIMAL

EIGHT_UNIT_KEYS = ["a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h100-pcie-80gb"]
BASE_IDS = [19, 14, 9, 5, 0]
FULL_IDS = [19, 15, 14, 9, 5, 0]


def codes(violations):
    return [v.code for v in violations]


@pytest.mark.parametrize("key", EIGHT_UNIT_KEYS)
@pytest.mark.parametrize("text", NINETEEN_MAXIMAL)
def test_each_of_the_nineteen_maximal_layouts_is_accepted(key, text):
    assert validate_layout(product(key), layout(text, EIGHT_UNIT_IDS)) == ()


@pytest.mark.parametrize("key", EIGHT_UNIT_KEYS)
def test_exactly_the_nineteen_maximal_layouts_are_enumerated(key):
    expected = {layout(text, EIGHT_UNIT_IDS) for text in NINETEEN_MAXIMAL}
    found = maximal_layouts(product(key), BASE_IDS)
    assert len(found) == 19
    assert set(found) == expected


def test_the_restricted_table_has_297_non_empty_valid_sets(a100):
    assert len(valid_layouts(a100, BASE_IDS)) == 297 + 1


def test_the_full_eight_unit_table_has_722_valid_sets_78_maximal_38_multisets(a100):
    maximal = maximal_layouts(a100, FULL_IDS)
    assert len(valid_layouts(a100, FULL_IDS)) == 722 + 1, "plus the empty layout"
    assert len(maximal) == 78
    assert len({tuple(sorted(i.profile_id for i in m)) for m in maximal}) == 38


@pytest.mark.parametrize("text", A30_MAXIMAL)
def test_each_of_the_five_maximal_a30_layouts_is_accepted(a30, text):
    assert validate_layout(a30, layout(text, A30_IDS)) == ()


def test_exactly_five_maximal_a30_layouts_from_25_valid_sets(a30):
    assert set(maximal_layouts(a30, [14, 5, 0])) == {layout(t, A30_IDS) for t in A30_MAXIMAL}
    assert len(valid_layouts(a30, [14, 5, 0])) == 25 + 1


def test_the_rtx_pro_6000_has_five_maximal_layouts_of_the_same_shape(rtx):
    ids = {"1g": 14, "2g": 5, "4g": 0}
    expected = {"4g@0", "2g@0 2g@6", "2g@0 1g@6 1g@9", "1g@0 1g@3 2g@6", "1g@0 1g@3 1g@6 1g@9"}
    assert set(maximal_layouts(rtx, [14, 5, 0])) == {layout(t, ids) for t in expected}
    assert len(valid_layouts(rtx, [14, 5, 0])) == 25 + 1


def test_every_layout_enumerated_without_a_filter_is_valid_and_maximal(a30):
    for found in maximal_layouts(a30):
        assert validate_layout(a30, found) == ()
        for profile in a30.profiles:
            assert free_placements(a30, profile.id, found) == ()


@pytest.mark.parametrize("key", ["a100-sxm4-40gb", "a30-24gb", "rtx-pro-6000-server"])
def test_every_overlapping_pair_of_placements_is_rejected(key):
    gpu = product(key)
    candidates = [(p.id, pl) for p in gpu.profiles for pl in p.placements]
    for (first_id, first), (second_id, second) in combinations(candidates, 2):
        if not first.overlaps(second):
            continue
        pair = [Instance(first_id, first.start), Instance(second_id, second.start)]
        assert OVERLAP in codes(validate_layout(gpu, pair)), (first_id, first, second_id, second)


@pytest.mark.parametrize("key", ["a100-sxm4-40gb", "a30-24gb", "rtx-pro-6000-server"])
def test_every_disjoint_pair_of_ordinary_placements_is_accepted(key):
    gpu = product(key)
    candidates = [(p.id, pl) for p in gpu.profiles if p.media in ("", "-me") for pl in p.placements]
    for (first_id, first), (second_id, second) in combinations(candidates, 2):
        if first.overlaps(second):
            continue
        pair = [Instance(first_id, first.start), Instance(second_id, second.start)]
        assert validate_layout(gpu, pair) == ()


def test_an_empty_layout_is_valid_even_without_mig(a100, l4):
    assert validate_layout(a100, []) == ()
    assert validate_layout(l4, []) == ()


def test_a_product_without_mig_rejects_any_instance(l4):
    violations = validate_layout(l4, [Instance(19, 0)])
    assert codes(violations) == [NOT_SUPPORTED]
    assert "NVIDIA L4" in violations[0].message


def test_an_unknown_profile_is_reported_with_the_known_ones(a100):
    violations = validate_layout(a100, [Instance(21, 0), Instance(19, 6)])
    assert codes(violations) == [UNKNOWN_PROFILE]
    assert "1g.5gb" in violations[0].message
    assert violations[0].details["profile_id"] == 21


def test_a_start_that_nvml_does_not_list_is_not_allowed(a100):
    violations = validate_layout(a100, [Instance(9, 2)])
    assert codes(violations) == [PLACEMENT_NOT_ALLOWED]
    assert violations[0].details["allowed_starts"] == [0, 4]


def test_a_start_outside_the_grid_is_not_allowed(a100):
    assert codes(validate_layout(a100, [Instance(19, 7)])) == [PLACEMENT_NOT_ALLOWED]
    assert codes(validate_layout(a100, [Instance(19, -1)])) == [PLACEMENT_NOT_ALLOWED]


def test_overlap_names_both_instances(a100):
    (violation,) = validate_layout(a100, [Instance(9, 4), Instance(14, 4)])
    assert violation.code == OVERLAP
    assert violation.details["first"]["profile"] == "3g.20gb"
    assert violation.details["second"]["profile"] == "2g.10gb"
    assert "3g.20gb at 4:4" in violation.message


def test_every_violation_is_returned_not_just_the_first(a100):
    instances = [Instance(9, 2), Instance(9, 0), Instance(99, 0), Instance(14, 4), Instance(5, 4)]
    assert sorted(codes(validate_layout(a100, instances))) == sorted(
        [UNKNOWN_PROFILE, PLACEMENT_NOT_ALLOWED, PLACEMENT_NOT_ALLOWED, *[OVERLAP] * 4]
    )


def test_more_instances_of_a_profile_than_its_count_are_too_many(a100):
    violations = validate_layout(a100, [Instance(9, 0), Instance(9, 4), Instance(9, 4)])
    assert TOO_MANY_INSTANCES in codes(violations)
    assert OVERLAP in codes(violations)


def test_more_instances_than_the_gpu_allows_are_too_many(a100):
    instances = [Instance(19, s) for s in range(7)] + [Instance(15, 0)]
    found = [v for v in validate_layout(a100, instances) if v.code == TOO_MANY_INSTANCES]
    assert [v.details for v in found] == [{"count": 8, "max_instances": 7}]


def test_one_plus_me_instance_is_allowed(a100):
    assert validate_layout(a100, [Instance(20, 0), Instance(19, 1), Instance(9, 4)]) == ()


def test_a_second_plus_me_instance_breaks_the_media_extension_limit(a100):
    violations = validate_layout(a100, [Instance(20, 0), Instance(20, 1)])
    assert codes(violations) == [MEDIA_EXTENSION_LIMIT]


def test_a30_allows_one_two_g_plus_me_only(a30):
    assert validate_layout(a30, [Instance(6, 0), Instance(14, 2)]) == ()
    assert codes(validate_layout(a30, [Instance(6, 0), Instance(6, 2)])) == [MEDIA_EXTENSION_LIMIT]


def test_a30_does_not_allow_a_one_g_and_a_two_g_plus_me_together(a30):
    violations = validate_layout(a30, [Instance(6, 0), Instance(21, 2)])
    assert codes(violations) == [MEDIA_EXTENSION_LIMIT]


def test_plus_me_all_allows_only_minus_me_profiles_besides_itself(rtx):
    assert validate_layout(rtx, [Instance(65, 0), Instance(67, 3), Instance(66, 6)]) == ()
    for other in (14, 21, 47, 65):
        violations = validate_layout(rtx, [Instance(65, 0), Instance(other, 3)])
        assert codes(violations) == [MEDIA_EXTENSION_LIMIT], other
    violations = validate_layout(rtx, [Instance(5, 0), Instance(64, 6)])
    assert codes(violations) == [MEDIA_EXTENSION_LIMIT]


def test_graphics_profiles_mix_with_ordinary_ones(rtx):
    assert validate_layout(rtx, [Instance(35, 0), Instance(14, 6), Instance(47, 9)]) == ()


def test_the_result_is_the_same_in_any_order(a100):
    instances = [Instance(9, 2), Instance(20, 0), Instance(20, 6), Instance(14, 4)]
    assert validate_layout(a100, instances) == validate_layout(a100, instances[::-1])


def test_occupied_slices_are_the_union_of_placements(a100):
    assert occupied_slices(a100, [Instance(9, 4), Instance(19, 1), Instance(77, 0)]) == {
        1,
        4,
        5,
        6,
        7,
    }


def test_free_placements_skip_occupied_slices(a100):
    assert free_placements(a100, 14, [Instance(19, 2)]) == (Placement(0, 2), Placement(4, 2))
    assert free_placements(a100, "3g.20gb", [Instance(19, 2)]) == (Placement(4, 4),)


def test_free_placements_respect_instance_counts(a100):
    two_3g = [Instance(9, 0)]
    assert free_placements(a100, 9, two_3g) == (Placement(4, 4),)
    assert free_placements(a100, 5, [Instance(19, 6)]) == (Placement(0, 4),)
    assert free_placements(a100, 5, [Instance(5, 0)]) == ()


def test_free_placements_respect_the_media_rules(a100, rtx):
    assert free_placements(a100, 20, [Instance(20, 0)]) == ()
    assert free_placements(rtx, 14, [Instance(65, 0)]) == ()
    assert free_placements(rtx, 67, [Instance(65, 0)]) == (
        Placement(3, 3),
        Placement(6, 3),
        Placement(9, 3),
    )


def test_free_placements_of_an_unknown_profile_or_a_gpu_without_mig_are_empty(a100, l4):
    assert free_placements(a100, 42, []) == ()
    assert free_placements(l4, 19, []) == ()


def test_free_placements_stop_at_the_instance_limit(a100):
    seven = [Instance(19, s) for s in range(7)]
    assert free_placements(a100, 19, seven[:6]) == (Placement(6, 1),)
    assert free_placements(a100, 19, seven) == ()
