"""What a GPU can still give a profile, checked against a brute force over every catalog product."""

from __future__ import annotations

import random
from functools import cache
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.mig import (
    PRODUCTS,
    Instance,
    Product,
    free_placements,
    max_new_instances,
    profile_capacity,
    valid_layouts,
    validate_layout,
)
from tests.mig.conftest import product

MIG_PRODUCTS = [p for p in PRODUCTS if p.mig_capable]


@cache
def layouts_of(gpu: Product) -> tuple[tuple[Instance, ...], ...]:
    return valid_layouts(gpu)


def brute_force_new(gpu: Product, profile_id: int, kept: tuple[Instance, ...]) -> int:
    """Every subset of the profile's placements added to ``kept``; the largest valid one."""
    profile = gpu.profile(profile_id)
    assert profile is not None
    starts = [where.start for where in profile.placements]
    best = 0
    for size in range(1, len(starts) + 1):
        for chosen in combinations(starts, size):
            added = tuple(Instance(profile_id, start) for start in chosen)
            if not validate_layout(gpu, (*kept, *added)):
                best = size
    return best


@st.composite
def gpu_layout_split_and_profile(draw):
    gpu = draw(st.sampled_from(MIG_PRODUCTS))
    layout = draw(st.sampled_from(layouts_of(gpu)))
    busy_flags = draw(st.lists(st.booleans(), min_size=len(layout), max_size=len(layout)))
    busy = tuple(i for i, flag in zip(layout, busy_flags, strict=True) if flag)
    idle = tuple(i for i, flag in zip(layout, busy_flags, strict=True) if not flag)
    profile = draw(st.sampled_from(gpu.profiles))
    return gpu, busy, idle, profile.id


@settings(max_examples=300, deadline=None)
@given(gpu_layout_split_and_profile())
def test_fits_now_is_the_idle_instances_plus_the_most_new_ones_a_brute_force_finds(case):
    gpu, busy, idle, profile_id = case
    found = profile_capacity(gpu, profile_id, busy, idle)
    idle_of_profile = sum(1 for i in idle if i.profile_id == profile_id)
    assert found.fits_now == idle_of_profile + brute_force_new(gpu, profile_id, (*busy, *idle))


@settings(max_examples=300, deadline=None)
@given(gpu_layout_split_and_profile())
def test_fits_if_idle_reshaped_is_the_most_a_brute_force_finds_beside_the_busy_instances(case):
    gpu, busy, idle, profile_id = case
    found = profile_capacity(gpu, profile_id, busy, idle)
    assert found.fits_if_idle_reshaped == brute_force_new(gpu, profile_id, busy)
    assert found.fits_if_idle_reshaped >= found.fits_now


@settings(max_examples=300, deadline=None)
@given(gpu_layout_split_and_profile(), st.randoms(use_true_random=False))
def test_any_order_of_creating_instances_reaches_the_count_so_it_never_overclaims(case, rnd):
    # The engine creates one instance at a time wherever its strategy likes: the count must be
    # what any such sequence reaches, not only the best one.
    gpu, busy, idle, profile_id = case
    layout = [*busy, *idle]
    created = 0
    while places := free_placements(gpu, profile_id, layout):
        layout.append(Instance(profile_id, rnd.choice(places).start))
        created += 1
    assert created == max_new_instances(gpu, profile_id, (*busy, *idle))


def test_the_seven_instance_limit_counts(a100):
    # Six 1g.5gb at 0-5 leave slice 6 and 7: one more 1g.5gb at 6 (its last placement), and 7 is
    # unreachable; with 1g.10gb at 6 the GPU is full at 7 instances.
    six = tuple(Instance(19, s) for s in range(6))
    assert max_new_instances(a100, "1g.5gb", six) == 1
    assert max_new_instances(a100, "1g.5gb", (*six, Instance(19, 6))) == 0
    assert profile_capacity(a100, "1g.5gb", (), ()).fits_now == 7


def test_only_one_media_extension_instance_fits_per_gpu(a100):
    assert profile_capacity(a100, "1g.5gb+me", (), ()).fits_now == 1
    me = a100.profile("1g.5gb+me")
    assert me is not None
    assert max_new_instances(a100, "1g.5gb+me", (Instance(me.id, 0),)) == 0


def test_an_idle_instance_counts_now_and_its_slices_count_after_a_reshape(a100):
    three_g = a100.profile("3g.20gb")
    assert three_g is not None
    busy = (Instance(three_g.id, 0),)
    idle = (Instance(three_g.id, 4),)
    found = profile_capacity(a100, "1g.5gb", busy, idle)
    assert (found.fits_now, found.fits_if_idle_reshaped) == (0, 3)
    assert profile_capacity(a100, "3g.20gb", busy, idle).fits_now == 1


def test_an_unknown_profile_or_a_product_without_mig_gives_nothing(a100, l4):
    assert profile_capacity(a100, "9g.99gb", (), ()) == profile_capacity(l4, "1g.5gb", (), ())
    assert max_new_instances(l4, 0, ()) == 0


def test_an_invalid_kept_layout_leaves_no_room(a100):
    overlapping = (Instance(19, 0), Instance(19, 0))
    assert max_new_instances(a100, "1g.5gb", overlapping) == 0


def test_a_seeded_sweep_of_every_product_and_profile_matches_the_brute_force():
    rnd = random.Random(20261201)
    for gpu in MIG_PRODUCTS:
        layouts = layouts_of(gpu)
        for _ in range(5):
            layout = rnd.choice(layouts)
            busy = tuple(i for i in layout if rnd.random() < 0.5)
            idle = tuple(i for i in layout if i not in busy)
            for profile in gpu.profiles:
                found = profile_capacity(gpu, profile.id, busy, idle)
                assert found.fits_if_idle_reshaped == brute_force_new(gpu, profile.id, busy)


def test_the_count_works_with_a_product_name_reference():
    h100 = product("h100-sxm5-80gb")
    assert max_new_instances(h100, "mig-3g.40gb", ()) == 2
