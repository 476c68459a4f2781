"""The environment and control-daemon commands that put MPS limits into effect."""

from __future__ import annotations

import pytest

from fleet.mps import MpsPolicy, MpsRequest, client_environment, daemon_commands

GPU_UUID = "GPU-5c1b4d1e-7a0f-2b3c-9d8e-0f1a2b3c4d5e"
MIG_UUID = "MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c4d"
OLD_MIG_UUID = "MIG-GPU-5c1b4d1e-7a0f-2b3c-9d8e-0f1a2b3c4d5e/1/0"


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (0, "0=1024M"),
        (3, "3=1024M"),
        ("1", "1=1024M"),
        (GPU_UUID, f"{GPU_UUID}=1024M"),
        (MIG_UUID, f"{MIG_UUID}=1024M"),
        (OLD_MIG_UUID, f"{OLD_MIG_UUID}=1024M"),
    ],
)
def test_the_pinned_memory_limit_names_the_device_by_ordinal_or_uuid(device, expected):
    env = client_environment(MpsRequest(1024), device=device)
    assert env == {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": expected}


def test_a_compute_limit_becomes_the_active_thread_percentage():
    env = client_environment(MpsRequest(2048, 25), device=0)
    assert env == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }


def test_the_pipe_directory_is_passed_when_given():
    env = client_environment(
        MpsRequest(512, 100), device=MIG_UUID, pipe_directory="/run/fleet/mps/" + MIG_UUID
    )
    assert env == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{MIG_UUID}=512M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
        "CUDA_MPS_PIPE_DIRECTORY": "/run/fleet/mps/" + MIG_UUID,
    }


@pytest.mark.parametrize(
    "device",
    [-1, True, "", "gpu0", "0,1", "0=1G", "GPU-", "MIG-abc def", "GPU-abc,1", " 0", "GPU-x=1"],
)
def test_a_malformed_device_reference_is_refused(device):
    with pytest.raises(ValueError, match="device"):
        client_environment(MpsRequest(1024), device=device)
    with pytest.raises(ValueError, match="device"):
        daemon_commands(device, MpsPolicy())


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (MpsRequest(0), "at least 1 MiB"),
        (MpsRequest(1, 101), "between 1 and 100"),
        (MpsRequest(0, 0), "at least 1 MiB.*; .*between 1 and 100"),
    ],
)
def test_an_invalid_request_has_no_environment(request_, match):
    with pytest.raises(ValueError, match=match):
        client_environment(request_, device=0)


def test_an_empty_pipe_directory_is_refused():
    with pytest.raises(ValueError, match="PIPE_DIRECTORY"):
        client_environment(MpsRequest(1), device=0, pipe_directory="")


@pytest.mark.parametrize(
    ("device", "policy", "expected"),
    [
        (0, MpsPolicy(), ("set_default_active_thread_percentage 100",)),
        (
            0,
            MpsPolicy(default_active_thread_percentage=50, default_pinned_mem_limit_mib=10240),
            (
                "set_default_active_thread_percentage 50",
                "set_default_device_pinned_mem_limit 0 10240M",
            ),
        ),
        (
            GPU_UUID,
            MpsPolicy(default_active_thread_percentage=1, default_pinned_mem_limit_mib=1),
            (
                "set_default_active_thread_percentage 1",
                f"set_default_device_pinned_mem_limit {GPU_UUID} 1M",
            ),
        ),
        # The client cap has no control command; Fleet enforces it when placing.
        (MIG_UUID, MpsPolicy(max_clients=4), ("set_default_active_thread_percentage 100",)),
    ],
)
def test_daemon_commands_apply_the_policy(device, policy, expected):
    assert daemon_commands(device, policy) == expected


@pytest.mark.parametrize(
    ("policy", "match"),
    [
        (MpsPolicy(default_active_thread_percentage=0), "percentage"),
        (MpsPolicy(default_active_thread_percentage=101), "percentage"),
        (MpsPolicy(default_pinned_mem_limit_mib=0), "memory"),
    ],
)
def test_daemon_commands_refuse_an_out_of_range_policy(policy, match):
    with pytest.raises(ValueError, match=match):
        daemon_commands(0, policy)
