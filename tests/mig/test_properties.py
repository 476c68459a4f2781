"""Properties of the layout rules and the search, on every geometry family."""

from __future__ import annotations

from collections import Counter
from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.mig import (
    Instance,
    Product,
    free_placements,
    occupied_slices,
    suggest_layout,
    valid_layouts,
    validate_layout,
)
from tests.mig.conftest import product

GPUS = [product(k) for k in ("a100-sxm4-40gb", "h200-sxm-141gb", "a30-24gb", "rtx-pro-6000-server")]


@cache
def layouts_of(gpu: Product) -> tuple[tuple[Instance, ...], ...]:
    return valid_layouts(gpu)


@cache
def layout_set(gpu: Product) -> frozenset[tuple[Instance, ...]]:
    return frozenset(layouts_of(gpu))


@cache
def fitting_multisets(gpu: Product) -> frozenset[tuple[int, ...]]:
    return frozenset(tuple(sorted(i.profile_id for i in layout)) for layout in layouts_of(gpu))


@st.composite
def gpu_and_instances(draw, *, allowed_only: bool = True):
    gpu = draw(st.sampled_from(GPUS))
    profile_ids = [p.id for p in gpu.profiles]
    if allowed_only:
        candidates = [Instance(p.id, pl.start) for p in gpu.profiles for pl in p.placements]
        instances = draw(st.lists(st.sampled_from(candidates), max_size=9))
    else:
        instance = st.builds(
            Instance,
            st.sampled_from([*profile_ids, 99]),
            st.integers(-1, gpu.memory_slice_count),
        )
        instances = draw(st.lists(instance, max_size=9))
    return gpu, instances


@st.composite
def gpu_layout_and_wanted(draw):
    gpu = draw(st.sampled_from(GPUS))
    existing = draw(st.sampled_from(layouts_of(gpu)))
    wanted = draw(st.lists(st.sampled_from([p.id for p in gpu.profiles]), max_size=7))
    return gpu, existing, wanted


@settings(max_examples=300, deadline=None)
@given(gpu_and_instances(allowed_only=False), st.randoms(use_true_random=False))
def test_validation_does_not_depend_on_instance_order(case, random):
    gpu, instances = case
    shuffled = list(instances)
    random.shuffle(shuffled)
    assert validate_layout(gpu, shuffled) == validate_layout(gpu, instances)


@settings(max_examples=300, deadline=None)
@given(gpu_and_instances())
def test_a_layout_of_allowed_placements_is_valid_exactly_when_it_is_enumerated(case):
    gpu, instances = case
    canonical = tuple(sorted(instances, key=lambda i: (i.start, i.profile_id)))
    assert (validate_layout(gpu, instances) == ()) == (canonical in layout_set(gpu))


@settings(max_examples=300, deadline=None)
@given(gpu_layout_and_wanted())
def test_a_suggested_layout_always_validates_and_never_moves_existing_instances(case):
    gpu, existing, wanted = case
    new = suggest_layout(gpu, wanted, existing)
    if new is None:
        return
    assert validate_layout(gpu, [*existing, *new]) == ()
    assert Counter(i.profile_id for i in new) == Counter(wanted)
    assert occupied_slices(gpu, new).isdisjoint(occupied_slices(gpu, existing))
    assert list(new) == sorted(new, key=lambda i: (i.start, i.profile_id))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(GPUS), st.data())
def test_suggest_finds_a_layout_exactly_when_one_exists(gpu, data):
    wanted = data.draw(st.lists(st.sampled_from([p.id for p in gpu.profiles]), max_size=8))
    suggestion = suggest_layout(gpu, wanted)
    assert (suggestion is not None) == (tuple(sorted(wanted)) in fitting_multisets(gpu))


@settings(max_examples=200, deadline=None)
@given(gpu_layout_and_wanted())
def test_suggest_is_deterministic(case):
    gpu, existing, wanted = case
    assert suggest_layout(gpu, wanted, existing) == suggest_layout(gpu, wanted[::-1], existing)


@settings(max_examples=300, deadline=None)
@given(gpu_layout_and_wanted(), st.data())
def test_free_placements_never_overlap_and_can_each_be_added(case, data):
    gpu, existing, _ = case
    profile = data.draw(st.sampled_from(gpu.profiles))
    used = occupied_slices(gpu, existing)
    free = free_placements(gpu, profile.id, existing)
    for placement in free:
        assert used.isdisjoint(placement.slices)
        assert validate_layout(gpu, [*existing, Instance(profile.id, placement.start)]) == ()
    for placement in set(profile.placements) - set(free):
        assert validate_layout(gpu, [*existing, Instance(profile.id, placement.start)]) != ()
