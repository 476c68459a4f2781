"""Fitting one more client on an MPS daemon's device."""

from __future__ import annotations

import pytest

from fleet.mps import MpsDevice, MpsPolicy, MpsRequest, check_fit, free_memory_mib, max_clients

GPU = MpsDevice.whole_gpu(memory_mib=10240)


def codes(violations):
    return [v.code for v in violations]


def clients(count, memory_mib=1):
    return [MpsRequest(memory_mib=memory_mib) for _ in range(count)]


@pytest.mark.parametrize(
    ("existing", "expected"),
    [
        ([], 10240),
        ([MpsRequest(1024)], 9216),
        ([MpsRequest(1024, 50), MpsRequest(2048)], 7168),
        ([MpsRequest(10240)], 0),
        # A device that shrank under its clients has nothing free, not a debt.
        ([MpsRequest(10240), MpsRequest(1)], 0),
    ],
)
def test_free_memory_counts_reservations(existing, expected):
    assert free_memory_mib(GPU, existing) == expected


@pytest.mark.parametrize(
    ("policy", "expected"),
    [(None, 48), (MpsPolicy(), 48), (MpsPolicy(max_clients=4), 4), (MpsPolicy(max_clients=60), 48)],
)
def test_max_clients_is_the_lower_of_device_and_policy(policy, expected):
    assert max_clients(GPU, policy) == expected


@pytest.mark.parametrize(
    ("existing", "request_", "expected"),
    [
        ([], MpsRequest(1), []),
        ([], MpsRequest(10240), []),
        ([MpsRequest(4096)], MpsRequest(6144), []),
        ([MpsRequest(4096)], MpsRequest(6145), ["mps.memory_overcommit"]),
        ([MpsRequest(10240)], MpsRequest(1), ["mps.memory_overcommit"]),
        ([], MpsRequest(10241), ["mps.memory_exceeds_device"]),
        # Larger than the device is reported once, not again as an overcommit.
        ([MpsRequest(4096)], MpsRequest(20480), ["mps.memory_exceeds_device"]),
        ([], MpsRequest(0), ["mps.memory_invalid"]),
        ([], MpsRequest(1, 0), ["mps.compute_percent_out_of_range"]),
        ([], MpsRequest(1, 101), ["mps.compute_percent_out_of_range"]),
        ([], MpsRequest(1, 100), []),
        # Compute is a limit, not a reservation: many clients may each ask for 100%.
        (clients(10, 1024)[:9], MpsRequest(1024, 100), []),
    ],
)
def test_check_fit_on_memory_and_request_rules(existing, request_, expected):
    assert codes(check_fit(GPU, existing, request_)) == expected


def test_memory_overcommit_says_what_is_free_and_what_was_asked():
    (violation,) = check_fit(GPU, [MpsRequest(4096)], MpsRequest(8192))
    assert violation.details == {"free_mib": 6144, "requested_mib": 8192}


def test_memory_exceeds_device_names_both_sizes():
    (violation,) = check_fit(GPU, [], MpsRequest(10241))
    assert violation.details == {"requested_mib": 10241, "device_memory_mib": 10240}


def test_the_48th_client_fits_and_the_49th_does_not():
    assert check_fit(GPU, clients(47), MpsRequest(1)) == ()
    (violation,) = check_fit(GPU, clients(48), MpsRequest(1))
    assert violation.code == "mps.too_many_clients"
    assert violation.details == {"clients": 48, "max_clients": 48}


@pytest.mark.parametrize(
    ("compute_slices", "gpu_compute_slices", "cap"),
    [(1, 7, 6), (2, 7, 13), (3, 7, 20), (4, 7, 27), (7, 7, 48), (1, 4, 12), (2, 4, 24), (4, 4, 48)],
)
def test_a_mig_instance_takes_clients_up_to_its_proportional_cap(
    compute_slices, gpu_compute_slices, cap
):
    device = MpsDevice.mig_instance(cap * 100, compute_slices, gpu_compute_slices)
    assert check_fit(device, clients(cap - 1), MpsRequest(1)) == ()
    assert codes(check_fit(device, clients(cap), MpsRequest(1))) == ["mps.too_many_clients"]


def test_the_operators_client_cap_is_enforced():
    policy = MpsPolicy(max_clients=4)
    assert check_fit(GPU, clients(3), MpsRequest(1), policy) == ()
    (violation,) = check_fit(GPU, clients(4), MpsRequest(1), policy)
    assert violation.code == "mps.too_many_clients"
    assert violation.details == {"clients": 4, "max_clients": 4}


@pytest.mark.parametrize(
    ("policy", "request_", "expected"),
    [
        (MpsPolicy(default_pinned_mem_limit_mib=2048), MpsRequest(2048), []),
        (MpsPolicy(default_pinned_mem_limit_mib=2048), MpsRequest(2049), ["memory_mib"]),
        (MpsPolicy(default_active_thread_percentage=50), MpsRequest(1, 50), []),
        (MpsPolicy(default_active_thread_percentage=50), MpsRequest(1, 51), ["compute_percent"]),
        # No limit of its own: the client runs under the daemon's default.
        (MpsPolicy(default_active_thread_percentage=50), MpsRequest(1), []),
        (
            MpsPolicy(default_active_thread_percentage=25, default_pinned_mem_limit_mib=1024),
            MpsRequest(4096, 100),
            ["memory_mib", "compute_percent"],
        ),
    ],
)
def test_a_request_above_the_daemons_defaults_exceeds_the_policy(policy, request_, expected):
    violations = check_fit(GPU, [], request_, policy)
    assert codes(violations) == ["mps.exceeds_policy_limit"] * len(expected)
    assert [v.details["resource"] for v in violations] == expected


def test_exceeds_policy_limit_names_the_limit():
    policy = MpsPolicy(default_pinned_mem_limit_mib=2048)
    (violation,) = check_fit(GPU, [], MpsRequest(3072), policy)
    assert violation.details == {"resource": "memory_mib", "requested": 3072, "limit": 2048}


def test_an_out_of_range_percent_is_not_reported_twice():
    policy = MpsPolicy(default_active_thread_percentage=50)
    violations = check_fit(GPU, [], MpsRequest(1, 101), policy)
    assert codes(violations) == ["mps.compute_percent_out_of_range"]


def test_check_fit_reports_every_broken_rule_at_once():
    policy = MpsPolicy(default_pinned_mem_limit_mib=1024, max_clients=2)
    violations = check_fit(GPU, clients(2, 5000), MpsRequest(2048, 0), policy)
    assert codes(violations) == [
        "mps.compute_percent_out_of_range",
        "mps.memory_overcommit",
        "mps.too_many_clients",
        "mps.exceeds_policy_limit",
    ]


def test_an_invalid_memory_request_skips_the_capacity_check():
    assert codes(check_fit(GPU, [MpsRequest(10240)], MpsRequest(-5))) == ["mps.memory_invalid"]
