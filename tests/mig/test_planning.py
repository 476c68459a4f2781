"""Layout suggestions: exact, deterministic, never moving what is already there."""

from __future__ import annotations

import pytest

from fleet.mig import (
    DOES_NOT_FIT,
    MEDIA_EXTENSION_LIMIT,
    NOT_SUPPORTED,
    OVERLAP,
    TOO_MANY_INSTANCES,
    UNKNOWN_PROFILE,
    Instance,
    UnknownProfileError,
    maximal_layouts,
    plan_layout,
    resolve_profiles,
    suggest_layout,
    validate_layout,
)
from tests.mig.conftest import product


def test_the_balanced_a100_layout_gets_the_placements_the_driver_chose(a100):
    # The guide's `-cgi 9,19,14,19` transcript: 1g at 0 and 1, 2g at 2:2, 3g at 4:4 (facts §1.2).
    assert suggest_layout(a100, ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]) == (
        Instance(19, 0),
        Instance(19, 1),
        Instance(14, 2),
        Instance(9, 4),
    )


def test_a_lone_small_instance_goes_where_it_blocks_the_fewest_large_placements(a100):
    assert suggest_layout(a100, [19]) == (Instance(19, 6),)
    assert suggest_layout(a100, [14]) == (Instance(14, 4),)
    assert suggest_layout(a100, [9]) == (Instance(9, 4),)


def test_the_order_of_wanted_profiles_does_not_matter(a100):
    # `nvidia-smi mig -cgi 19,19,14,9` fails while `9,19,14,19` succeeds (facts §1.6); not here.
    assert suggest_layout(a100, [19, 19, 14, 9]) == suggest_layout(a100, [9, 19, 14, 19])


def test_every_maximal_layout_can_be_suggested_from_its_profiles(a100):
    for found in maximal_layouts(a100, [19, 15, 14, 9, 5, 0]):
        suggestion = suggest_layout(a100, [i.profile_id for i in found])
        assert suggestion is not None
        assert validate_layout(a100, suggestion) == ()


def test_existing_instances_are_kept_and_only_new_ones_returned(a100):
    existing = [Instance(19, 0)]
    suggestion = suggest_layout(a100, ["3g.20gb", "2g.10gb"], existing)
    assert suggestion == (Instance(14, 2), Instance(9, 4))


def test_a_profile_that_fits_only_around_existing_instances_is_placed_there(a100):
    existing = [Instance(14, 0), Instance(19, 2), Instance(19, 3), Instance(19, 4), Instance(19, 5)]
    assert suggest_layout(a100, [19]) == (Instance(19, 6),)
    assert suggest_layout(a100, [19], existing) == (Instance(19, 6),)
    assert suggest_layout(a100, [19, 19], existing) is None


def test_nothing_wanted_fits_trivially(a100, l4):
    assert suggest_layout(a100, []) == ()
    assert suggest_layout(l4, []) == ()


def test_a_set_that_needs_more_slices_than_the_gpu_has_does_not_fit(a100):
    plan = plan_layout(a100, ["3g.20gb", "3g.20gb", "1g.5gb"])
    assert not plan.fits
    assert [v.code for v in plan.violations] == [DOES_NOT_FIT]
    assert plan.violations[0].details == {
        "wanted": ["3g.20gb", "3g.20gb", "1g.5gb"],
        "wanted_slices": 9,
        "free_slices": 8,
    }
    assert suggest_layout(a100, ["3g.20gb", "3g.20gb", "1g.5gb"]) is None


def test_a_set_that_fits_by_slice_count_but_not_by_placement_does_not_fit(a100):
    # 4g only starts at 0, and 1g.10gb (id 15) at 0 would need slice 0 too.
    plan = plan_layout(a100, ["4g.20gb", "1g.10gb", "1g.10gb", "1g.10gb"])
    assert [v.code for v in plan.violations] == [DOES_NOT_FIT]


def test_counts_that_can_never_fit_are_explained(a100):
    plan = plan_layout(a100, ["1g.5gb"] * 8)
    assert [v.code for v in plan.violations] == [TOO_MANY_INSTANCES, TOO_MANY_INSTANCES]


def test_two_plus_me_instances_are_explained_by_the_media_rule(a100):
    plan = plan_layout(a100, ["1g.5gb+me", "1g.5gb+me"])
    assert [v.code for v in plan.violations] == [MEDIA_EXTENSION_LIMIT]


def test_a_plus_me_instance_next_to_an_existing_one_is_explained(a100):
    plan = plan_layout(a100, ["1g.5gb+me"], [Instance(20, 0)])
    assert [v.code for v in plan.violations] == [MEDIA_EXTENSION_LIMIT]


def test_an_invalid_existing_layout_is_reported_instead_of_planned_around(a100):
    plan = plan_layout(a100, ["1g.5gb"], [Instance(9, 0), Instance(5, 0)])
    assert [v.code for v in plan.violations] == [OVERLAP]
    assert suggest_layout(a100, ["1g.5gb"], [Instance(9, 0), Instance(5, 0)]) is None


def test_unknown_profiles_are_explained_by_plan_and_raised_by_suggest(a100):
    plan = plan_layout(a100, ["1g.6gb", 19, "banana"])
    assert [v.code for v in plan.violations] == [UNKNOWN_PROFILE, UNKNOWN_PROFILE]
    with pytest.raises(UnknownProfileError, match="banana") as caught:
        suggest_layout(a100, ["banana"])
    assert caught.value.ref == "banana"
    assert caught.value.product is a100


def test_a_gpu_without_mig_fits_nothing(l4):
    plan = plan_layout(l4, ["1g.5gb"])
    assert [v.code for v in plan.violations] == [NOT_SUPPORTED]
    assert suggest_layout(l4, ["1g.5gb"]) is None


def test_profiles_resolve_in_the_given_order(a30):
    assert [p.id for p in resolve_profiles(a30, ["1g.6gb", 0, "mig-2g.12gb"])] == [14, 0, 5]


def test_a30_suggestions_use_its_four_slice_grid(a30):
    assert suggest_layout(a30, ["2g.12gb", "1g.6gb", "1g.6gb"]) == (
        Instance(14, 0),
        Instance(14, 1),
        Instance(5, 2),
    )


def test_rtx_pro_6000_suggestions_use_its_twelve_slice_grid(rtx):
    assert suggest_layout(rtx, ["2g.48gb", "1g.24gb", "1g.24gb"]) == (
        Instance(14, 0),
        Instance(14, 3),
        Instance(5, 6),
    )
    assert suggest_layout(rtx, ["1g.24gb+me.all", "1g.24gb-me", "2g.48gb-me"]) is not None
    assert suggest_layout(rtx, ["1g.24gb+me.all", "1g.24gb"]) is None


def test_a_hopeless_request_on_a_full_search_space_finishes(a100):
    wanted = ["1g.10gb"] * 4 + ["1g.5gb"] * 3
    assert plan_layout(a100, wanted).fits is False
    assert suggest_layout(product("h100-sxm5-80gb"), ["1g.20gb"] * 3 + ["1g.10gb"]) is not None
