"""A team's policy: the defaults are restricted, a bad policy is refused field by field, each
rule refuses a workload with its own code, and the policy resolves into the agent's security
block."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.core.errors import ServiceError
from fleet.core.policy import (
    DEFAULTS,
    effective_policy,
    image_allowed,
    normalized_image,
    policy_checked,
    policy_violations,
    workload_security,
)
from hostagent.protocol import default_workload


def workload(**fields: Any) -> dict[str, Any]:
    return {**default_workload(), **fields}


def container(**fields: Any) -> dict[str, Any]:
    return workload(
        **{"runtime": "container", "image": "python:3.11", "command": ["serve"], **fields}
    )


def process(**fields: Any) -> dict[str, Any]:
    return workload(runtime="process", command=["/usr/bin/serve"], **fields)


def codes(policy: dict[str, Any], spec: dict[str, Any], **kwargs: Any) -> list[str]:
    return [v.code for v in policy_violations(effective_policy(policy), spec, **kwargs)]


ALLOW_PROCESS = {"runtimes": ["container", "process"], "process_user": "1000:1000"}


def test_an_empty_policy_is_the_restricted_default():
    assert effective_policy({}) == DEFAULTS
    assert DEFAULTS["runtimes"] == ["container"]
    assert DEFAULTS["allow_root"] is False
    assert DEFAULTS["host_network"] is False
    assert DEFAULTS["capabilities"] == []


def test_the_default_policy_refuses_the_process_runtime_and_says_how_to_allow_it():
    [violation] = policy_violations(effective_policy({}), process())
    assert violation.code == "policy.runtime_denied"
    assert "PUT /api/v1/teams/" in violation.message
    assert violation.details == {"runtime": "process", "allowed": ["container"]}


def test_runtime_none_and_a_plain_container_pass_the_default_policy():
    assert codes({}, workload()) == []
    assert codes({}, container()) == []
    assert codes({}, container(user="1000:1000")) == []


def test_a_process_runs_only_as_the_policys_process_user():
    assert codes(ALLOW_PROCESS, process()) == []
    assert codes(ALLOW_PROCESS, process(user="1000:1000")) == []
    assert codes(ALLOW_PROCESS, process(user="1001")) == ["policy.user_denied"]
    assert codes(ALLOW_PROCESS, process(user="root")) == ["policy.user_denied"]


@pytest.mark.parametrize("user", ["0", "0:0", "root", "root:root", "1000:0", "1000:root"])
def test_root_is_refused_unless_the_policy_allows_it(user):
    assert codes({}, container(user=user)) == ["policy.user_denied"]
    assert codes({"allow_root": True}, container(user=user)) == []


@pytest.mark.parametrize(
    ("user", "refused"),
    [("999", True), ("1000", False), ("5000:5000", False), ("svc", True), ("70000", True)],
)
def test_a_containers_user_is_a_numeric_uid_in_the_allowed_ranges(user, refused):
    policy = {"uids": [[1000, 65535]]}
    assert codes(policy, container(user=user)) == (["policy.user_denied"] if refused else [])


def test_a_user_of_non_ascii_digits_is_judged_not_crashed_on():
    """``²`` is a digit to str.isdigit and not to int(): the policy judges it, as a name."""
    assert codes({"uids": []}, container(user="²")) == []
    # Outside numeric uid ranges: refused, as any name is.
    assert codes({"uids": [[1000, 65535]]}, container(user="1000:²")) == ["policy.user_denied"]


def test_without_uid_ranges_a_user_name_other_than_root_is_taken():
    assert codes({"uids": []}, container(user="svc")) == []
    assert codes({"uids": []}, container(user="root")) == ["policy.user_denied"]


@pytest.mark.parametrize(
    ("image", "normalized"),
    [
        ("python:3.11", "docker.io/library/python:3.11"),
        ("org/app", "docker.io/org/app"),
        ("registry.example.com/team-a/model:1", "registry.example.com/team-a/model:1"),
        ("localhost:5000/x", "localhost:5000/x"),
        ("index.docker.io/library/python", "docker.io/library/python"),
    ],
)
def test_an_image_is_read_with_its_registry_as_docker_reads_it(image, normalized):
    assert normalized_image(image) == normalized


def test_images_come_from_the_allowed_prefixes_or_repositories():
    registries = ["registry.example.com/team-a/", "docker.io/library/python"]
    assert image_allowed("registry.example.com/team-a/model:1", registries)
    assert image_allowed("python:3.11", registries)
    assert image_allowed("python@sha256:" + "a" * 64, registries)
    assert not image_allowed("pythonista:1", registries)
    assert not image_allowed("registry.example.com/team-ab/model:1", registries)
    assert not image_allowed("attacker.example:5000/miner:latest", registries)
    assert image_allowed("attacker.example:5000/miner:latest", [])


def test_an_image_outside_the_registries_is_refused():
    policy = {"registries": ["registry.example.com/team-a/"]}
    assert codes(policy, container()) == ["policy.image_denied"]
    assert codes(policy, container(image="registry.example.com/team-a/m:1")) == []


def test_host_memory_past_the_maximum_is_refused():
    assert codes({}, container(), host_memory_mib=65536) == []
    assert codes({}, container(), host_memory_mib=65537) == ["policy.host_memory_denied"]


def test_every_broken_rule_is_listed_runtime_first():
    policy = {"registries": ["registry.example.com/"]}
    assert codes({**policy, "runtimes": []}, container(user="0"), host_memory_mib=10**6) == [
        "policy.runtime_denied",
        "policy.image_denied",
        "policy.user_denied",
        "policy.host_memory_denied",
    ]


def test_a_valid_policy_is_stored_as_given_without_the_runtime_none():
    stored = policy_checked({**ALLOW_PROCESS, "runtimes": ["none", "process"]})
    assert stored == {"runtimes": ["process"], "process_user": "1000:1000"}


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"runtime": ["process"]}, "runtime"),
        ({"runtimes": ["vm"]}, "runtimes"),
        ({"runtimes": "container"}, "runtimes"),
        ({"runtimes": ["process"]}, "process_user"),
        ({"runtimes": ["process"], "process_user": "0:0"}, "process_user"),
        ({"runtimes": ["process"], "process_user": "svc"}, "process_user"),
        ({"runtimes": ["process"], "process_user": "500"}, "process_user"),
        ({"registries": ["python/"]}, "registries"),
        ({"registries": ["registry.example.com"]}, "registries"),
        ({"registries": ["registry.example.com/../x/"]}, "registries"),
        ({"uids": [[2000, 1000]]}, "uids"),
        ({"uids": [[0, 2**32]]}, "uids"),
        ({"allow_root": "yes"}, "allow_root"),
        ({"capabilities": ["SYS_ADMIN"]}, "capabilities"),
        ({"capabilities": ["NET_RAW"]}, "capabilities"),
        ({"max_host_memory_mib": 0}, "max_host_memory_mib"),
        ({"max_host_memory_mib": True}, "max_host_memory_mib"),
        ({"max_host_memory_mib": 1024}, "default_host_memory_mib"),
        ({"max_pids": 1}, "max_pids"),
        ({"host_network": 1}, "host_network"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(policy, field):
    with pytest.raises(ServiceError) as refused:
        policy_checked(policy)
    assert refused.value.code == "policy.invalid"
    assert refused.value.status_code == 400
    assert field in refused.value.details["fields"]


def test_root_may_be_the_process_user_only_when_root_is_allowed():
    policy = {**ALLOW_PROCESS, "process_user": "0:0", "allow_root": True}
    assert policy_checked(policy)["process_user"] == "0:0"


def test_a_process_gets_the_policys_user_and_limits():
    policy = effective_policy(
        {**ALLOW_PROCESS, "capabilities": ["NET_BIND_SERVICE"], "max_pids": 512}
    )
    assert workload_security(policy, process(), 2048) == {
        "user": "1000:1000",
        "allow_root": False,
        "cap_add": ["NET_BIND_SERVICE"],
        "pids_limit": 512,
        "memory_mib": 2048,
        "host_network": False,
    }


def test_a_container_keeps_its_own_user_or_the_images_and_the_default_memory():
    policy = effective_policy({"host_network": True})
    security = workload_security(policy, container(user="1234"))
    assert security["user"] == "1234"
    assert security["memory_mib"] == DEFAULTS["default_host_memory_mib"]
    assert security["host_network"] is True
    assert workload_security(policy, container())["user"] is None


def test_a_lowered_maximum_caps_the_memory_of_a_deployment_made_before():
    policy = effective_policy({"max_host_memory_mib": 4096, "default_host_memory_mib": 1024})
    assert workload_security(policy, container(), 8192)["memory_mib"] == 4096


def test_the_security_block_passes_the_wire_contract():
    from hostagent.protocol import Security, validate

    policy = effective_policy({**ALLOW_PROCESS, "capabilities": sorted(["KILL", "CHOWN"])})
    validate(workload_security(policy, process(), 32768), Security)
