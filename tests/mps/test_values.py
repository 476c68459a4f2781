"""Client requests, device capacity and operator policy, checked on their own."""

from __future__ import annotations

import pytest

from fleet.mps import MAX_CLIENTS_PER_GPU, MpsDevice, MpsPolicy, MpsRequest
from fleet.mps.values import validate_policy, validate_request


def codes(violations):
    return [v.code for v in violations]


def test_the_client_limit_is_the_mig_guides_48():
    assert MAX_CLIENTS_PER_GPU == 48


@pytest.mark.parametrize(
    ("memory_mib", "percent", "expected"),
    [
        (1, None, []),
        (1, 1, []),
        (1, 100, []),
        (81920, 50, []),
        (0, None, ["mps.memory_invalid"]),
        (-1, None, ["mps.memory_invalid"]),
        (1, 0, ["mps.compute_percent_out_of_range"]),
        (1, 101, ["mps.compute_percent_out_of_range"]),
        (1, -5, ["mps.compute_percent_out_of_range"]),
        (0, 101, ["mps.memory_invalid", "mps.compute_percent_out_of_range"]),
    ],
)
def test_validate_request_reports_every_broken_rule(memory_mib, percent, expected):
    request = MpsRequest(memory_mib=memory_mib, max_compute_percent=percent)
    assert codes(validate_request(request)) == expected


def test_request_violations_carry_the_offending_value():
    (memory, percent) = validate_request(MpsRequest(memory_mib=0, max_compute_percent=101))
    assert memory.details == {"memory_mib": 0}
    assert percent.details == {"max_compute_percent": 101}
    assert memory.as_dict()["code"] == "mps.memory_invalid"


@pytest.mark.parametrize(("percent", "effective"), [(None, 100), (1, 1), (60, 60), (100, 100)])
def test_an_unset_compute_percent_means_the_whole_device(percent, effective):
    assert MpsRequest(1024, percent).effective_compute_percent == effective


def test_a_whole_gpu_accepts_48_clients():
    assert MpsDevice.whole_gpu(81559) == MpsDevice(memory_mib=81559, max_clients=48)


@pytest.mark.parametrize(
    ("compute_slices", "gpu_compute_slices", "expected_clients"),
    [
        # 7-slice GPUs (A100/H100/H200/B200): floor(48 * g / 7).
        (1, 7, 6),
        (2, 7, 13),
        (3, 7, 20),
        (4, 7, 27),
        (7, 7, 48),
        # A30, 4 slices: floor(48 * g / 4).
        (1, 4, 12),
        (2, 4, 24),
        (4, 4, 48),
        # The floor of 1 keeps a tiny instance usable on a hypothetical many-slice GPU.
        (1, 64, 1),
    ],
)
def test_a_mig_instance_accepts_clients_in_proportion_to_its_compute(
    compute_slices, gpu_compute_slices, expected_clients
):
    device = MpsDevice.mig_instance(
        memory_mib=20096, compute_slices=compute_slices, gpu_compute_slices=gpu_compute_slices
    )
    assert device.max_clients == expected_clients
    assert device.memory_mib == 20096


@pytest.mark.parametrize(
    ("compute_slices", "gpu_compute_slices"), [(0, 7), (8, 7), (-1, 7), (1, 0), (0, 0)]
)
def test_a_mig_instance_with_impossible_slices_is_refused(compute_slices, gpu_compute_slices):
    with pytest.raises(ValueError, match="slice"):
        MpsDevice.mig_instance(1024, compute_slices, gpu_compute_slices)


@pytest.mark.parametrize(
    ("memory_mib", "max_clients", "match"),
    [(0, 48, "memory"), (-1, 48, "memory"), (1024, 0, "client")],
)
def test_a_device_without_memory_or_client_slots_is_refused(memory_mib, max_clients, match):
    with pytest.raises(ValueError, match=match):
        MpsDevice(memory_mib=memory_mib, max_clients=max_clients)


def test_the_default_policy_is_the_drivers_default():
    policy = MpsPolicy()
    assert policy.default_active_thread_percentage == 100
    assert policy.default_pinned_mem_limit_mib is None
    assert policy.max_clients is None


GPU = MpsDevice(memory_mib=10240, max_clients=20)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (MpsPolicy(), []),
        (MpsPolicy(1, 1, 1), []),
        (MpsPolicy(100, 10240, 20), []),
        (MpsPolicy(default_active_thread_percentage=0), ["thread_percentage_out_of_range"]),
        (MpsPolicy(default_active_thread_percentage=101), ["thread_percentage_out_of_range"]),
        (MpsPolicy(default_pinned_mem_limit_mib=0), ["memory_limit_invalid"]),
        (MpsPolicy(default_pinned_mem_limit_mib=-1), ["memory_limit_invalid"]),
        (MpsPolicy(default_pinned_mem_limit_mib=10241), ["memory_limit_exceeds_device"]),
        (MpsPolicy(max_clients=0), ["max_clients_out_of_range"]),
        (MpsPolicy(max_clients=21), ["max_clients_out_of_range"]),
        (
            MpsPolicy(0, 10241, 21),
            [
                "thread_percentage_out_of_range",
                "memory_limit_exceeds_device",
                "max_clients_out_of_range",
            ],
        ),
    ],
)
def test_validate_policy_reports_every_broken_rule(policy, expected):
    assert codes(validate_policy(GPU, policy)) == [f"mps.policy_{rule}" for rule in expected]


def test_policy_violations_name_the_device_limit():
    (memory, clients) = validate_policy(
        GPU, MpsPolicy(default_pinned_mem_limit_mib=20480, max_clients=48)
    )
    assert memory.details == {"default_pinned_mem_limit_mib": 20480, "device_memory_mib": 10240}
    assert clients.details == {"max_clients": 48, "device_max_clients": 20}
