"""The workload contract: image grammar, the rules a type cannot say, the environment."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from hostagent import protocol
from hostagent.protocol import ProtocolError
from hostagent.protocol.workloads import (
    default_health,
    default_workload,
    is_image_reference,
    workload_environment,
    workload_problems,
)


def _workload(**changes: Any) -> protocol.Workload:
    workload = default_workload()
    workload.update(changes)  # type: ignore[typeddict-item]
    return workload


@pytest.mark.parametrize(
    "image",
    [
        "busybox",
        "fleet-test/busybox:2",
        "registry.example/llm:1.2",
        "localhost:5000/team/model_server:v2.0-rc1",
        "ghcr.io/org/a.b__c--d:latest",
        "nvcr.io/nvidia/tritonserver:24.05-py3",
        "[::1]:5000/x",
        "ubuntu@sha256:" + "a" * 64,
        "registry.example/llm:1.2@sha256:" + "0123456789abcdef" * 4,
    ],
)
def test_image_references_of_the_docker_grammar_are_accepted(image):
    assert is_image_reference(image)
    assert workload_problems(_workload(runtime="container", image=image)) == []


@pytest.mark.parametrize(
    "image",
    [
        "",
        "UPPER/case",
        "name:",
        "name:-tag",
        "a//b",
        "-lead",
        "trail-",
        "a b",
        "name@sha256:short",
        "name:" + "t" * 129,
        "Registry.Example/UPPER",
        "x/../y",
    ],
)
def test_malformed_image_references_are_refused(image):
    problems = workload_problems(_workload(runtime="container", image=image))
    assert [field for field, _ in problems] == ["image"]


def test_the_image_grammar_answers_at_once_on_adversarial_input():
    started = time.perf_counter()
    for text in ("a" + "-" * 240 + "!", "a" + "._" * 120 + "!", "a" * 250 + ":" + "-" * 120):
        assert not is_image_reference(text)
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"runtime": "container"}, "image"),
        ({"runtime": "process"}, "command"),
        ({"runtime": "process", "command": ["x"], "image": "busybox"}, "image"),
        ({"runtime": "none", "command": ["x"]}, "runtime"),
        ({"runtime": "process", "command": ["a\x00b"]}, "command[0]"),
        ({"runtime": "process", "command": ["x"], "env": {"CUDA_VISIBLE_DEVICES": "1"}}, None),
        ({"runtime": "process", "command": ["x"], "env": {"nvidia_driver": "1"}}, None),
        ({"runtime": "process", "command": ["x"], "env": {"FLEET_REPLICA": "1"}}, None),
        ({"runtime": "process", "command": ["x"], "cwd": "relative"}, "cwd"),
        ({"runtime": "process", "command": ["x"], "user": "root; rm"}, "user"),
    ],
)
def test_rules_a_type_cannot_say(changes, field):
    problems = workload_problems(_workload(**changes))
    assert problems, changes
    if field is not None:
        assert problems[0][0] == field
    else:
        assert problems[0][0].startswith("env.")


@pytest.mark.parametrize("user", ["svc", "1000", "1000:1000", "svc:video", "_x.y-z"])
def test_users_by_name_or_id_are_accepted(user):
    assert workload_problems(_workload(runtime="process", command=["x"], user=user)) == []


def test_a_health_check_has_exactly_one_probe_and_a_timeout_within_its_interval():
    base = _workload(runtime="process", command=["x"])
    none: protocol.HealthCheck = default_health()
    assert [f for f, _ in workload_problems({**base, "health": none})] == ["health"]
    both: protocol.HealthCheck = {
        **default_health(),
        "tcp": {"port": 1},
        "exec": {"command": ["t"]},
    }
    assert [f for f, _ in workload_problems({**base, "health": both})] == ["health"]
    slow: protocol.HealthCheck = {**default_health(), "tcp": {"port": 1}, "timeout_s": 20}
    assert [f for f, _ in workload_problems({**base, "health": slow})] == ["health.timeout_s"]
    bad_path: protocol.HealthCheck = {**default_health(), "http": {"port": 80, "path": "health"}}
    assert [f for f, _ in workload_problems({**base, "health": bad_path})] == ["health.http.path"]


def _desired(workload: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "desired_state",
        "generation": 1,
        "gpus": {
            "GPU-1": {
                "mode": "dedicated",
                "mig_enabled": False,
                "instances": [],
                "mps": {
                    "enabled": False,
                    "per_instance": False,
                    "default_active_thread_percentage": None,
                    "default_pinned_mem_limit_mib": None,
                },
                "allocations": [
                    {
                        "key": "a1:x[0]",
                        "gpu_uuid": "GPU-1",
                        "partition_key": None,
                        "memory_mib": None,
                        "max_compute_percent": None,
                        "allocation_id": 1,
                        "deployment": "x",
                        "replica": 0,
                        "workload": workload,
                    }
                ],
            }
        },
    }


def test_a_desired_state_carrying_a_broken_workload_is_refused_where_it_is_received():
    good = _workload(runtime="process", command=["/bin/true"])
    assert protocol.validate_message(_desired(dict(good)))["type"] == "desired_state"
    with pytest.raises(ProtocolError, match="needs a command") as caught:
        protocol.validate_message(_desired(dict(_workload(runtime="process"))))
    assert caught.value.path.endswith(".workload.command")
    too_many = {**good, "env": {f"V{i}": "x" for i in range(protocol.MAX_ENV + 1)}}
    with pytest.raises(ProtocolError):
        protocol.validate_message(_desired(too_many))
    bad_name = {**good, "env": {"1BAD": "x"}}
    with pytest.raises(ProtocolError):
        protocol.validate_message(_desired(bad_name))


def test_a_desired_allocation_without_workload_fields_still_validates():
    message = _desired(dict(default_workload()))
    allocation = message["gpus"]["GPU-1"]["allocations"][0]
    for key in ("allocation_id", "deployment", "replica", "workload"):
        del allocation[key]
    assert protocol.validate_message(copy.deepcopy(message)) == message


def test_a_workload_report_repeating_a_replica_is_refused():
    status = {
        "allocation_id": 3,
        "state": "running",
        "started_at": 1.0,
        "exit_code": None,
        "restarts": 0,
        "message": "",
        "pids": [],
    }
    report = {"type": "workloads", "ts": 1.0, "full": False, "workloads": [status, status]}
    with pytest.raises(ProtocolError, match="allocation_id"):
        protocol.validate_message(report)
    with pytest.raises(ProtocolError):
        protocol.validate_message({**report, "workloads": [{**status, "state": "zombie"}]})


def test_the_environment_names_the_device_and_enforces_an_mps_share():
    env = workload_environment(device_uuid="MIG-abc", allocation_id=7, deployment="llm", replica=2)
    assert env == {
        "CUDA_VISIBLE_DEVICES": "MIG-abc",
        "NVIDIA_VISIBLE_DEVICES": "MIG-abc",
        "FLEET_ALLOCATION_ID": "7",
        "FLEET_DEPLOYMENT": "llm",
        "FLEET_REPLICA": "2",
    }
    shared = workload_environment(
        device_uuid="GPU-1",
        allocation_id=8,
        deployment="small",
        replica=0,
        mps_pipe_directory="/run/fleet-mps/GPU-1/pipe",
        mps_memory_mib=4096,
        mps_compute_percent=25,
    )
    assert shared["CUDA_MPS_PIPE_DIRECTORY"] == "/run/fleet-mps/GPU-1/pipe"
    assert shared["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert shared["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
