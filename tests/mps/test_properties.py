"""Properties of the fit check that must hold for any sequence of requests."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleet.mps import MpsDevice, MpsPolicy, MpsRequest, check_fit, free_memory_mib

devices = st.builds(
    MpsDevice,
    memory_mib=st.integers(min_value=1, max_value=200_000),
    max_clients=st.integers(min_value=1, max_value=48),
)
requests = st.builds(
    MpsRequest,
    memory_mib=st.integers(min_value=-10, max_value=100_000),
    max_compute_percent=st.none() | st.integers(min_value=-5, max_value=110),
)
policies = st.none() | st.builds(
    MpsPolicy,
    default_active_thread_percentage=st.integers(min_value=1, max_value=100),
    default_pinned_mem_limit_mib=st.none() | st.integers(min_value=1, max_value=100_000),
    max_clients=st.none() | st.integers(min_value=1, max_value=48),
)


def place_one_by_one(device, candidates, policy):
    placed = []
    for request in candidates:
        if not check_fit(device, placed, request, policy):
            placed.append(request)
    return placed


@given(devices, st.lists(requests, max_size=80), policies)
def test_accepted_requests_never_sum_past_capacity(device, candidates, policy):
    placed = place_one_by_one(device, candidates, policy)
    assert sum(r.memory_mib for r in placed) <= device.memory_mib
    assert len(placed) <= device.max_clients
    assert all(r.memory_mib >= 1 for r in placed)
    assert free_memory_mib(device, placed) == device.memory_mib - sum(r.memory_mib for r in placed)


@given(devices, st.lists(requests, max_size=60), requests, policies, st.randoms())
def test_the_order_of_existing_clients_does_not_matter(device, existing, request, policy, rnd):
    shuffled = list(existing)
    rnd.shuffle(shuffled)
    assert check_fit(device, shuffled, request, policy) == check_fit(
        device, existing, request, policy
    )
    assert free_memory_mib(device, shuffled) == free_memory_mib(device, existing)


@given(devices, st.lists(requests, max_size=60), requests, policies)
def test_violation_details_agree_with_free_memory(device, existing, request, policy):
    for violation in check_fit(device, existing, request, policy):
        if violation.code == "mps.memory_overcommit":
            assert violation.details["free_mib"] == free_memory_mib(device, existing)
            assert violation.details["requested_mib"] > violation.details["free_mib"]
