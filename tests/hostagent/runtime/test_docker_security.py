"""Containers get Kubernetes' ``restricted`` defaults (review H3), and images are pulled before
every start unless the agent says ``if-not-present``: the pure config, and the runtime's start
against a stand-in for the Engine API (the real Engine has test_docker.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import docker.errors
import pytest

from hostagent.protocol import default_security
from hostagent.runtime import ReplicaSpec, StartError
from hostagent.runtime.docker import ROOT_IMAGE, DockerRuntime, container_config, pinned_digest
from tests.hostagent.runtime.fakes import exec_health, workload

IMAGE = "registry.example/team-a/model:1"
DIGEST = "sha256:" + "a" * 64


def spec(sec=None, pipe=None, **changes) -> ReplicaSpec:
    return ReplicaSpec(
        allocation_id=3,
        key="a3",
        gpu_uuid="GPU-1",
        deployment="qwen-7b",
        replica=0,
        workload=workload("container", **{"image": IMAGE, **changes}),
        device_uuid="MIG-1",
        mps_pipe_directory=pipe,
        security={**default_security(), "user": "1000", **(sec or {})},
    )


def test_a_default_replica_gets_the_restricted_profile():
    config = container_config(spec(), "h1")
    host = config["host"]
    assert host["cap_drop"] == ["ALL"] and host["cap_add"] == []
    assert host["security_opt"] == ["no-new-privileges"]
    assert host["pids_limit"] == 4096
    assert host["network_mode"] == "none" and host["ipc_mode"] == "private"
    assert "mem_limit" not in host and "binds" not in host
    assert config["user"] == "1000"


def test_the_policy_adds_capabilities_memory_and_the_hosts_network():
    sec = {"cap_add": ["NET_BIND_SERVICE"], "memory_mib": 2048, "host_network": True}
    host = container_config(spec(sec), "h1")["host"]
    assert host["cap_drop"] == ["ALL"] and host["cap_add"] == ["NET_BIND_SERVICE"]
    assert host["mem_limit"] == host["memswap_limit"] == 2048 * 2**20
    assert host["network_mode"] == "host"


def test_an_mps_share_keeps_host_ipc_and_mounts_the_pipe_directory_read_only():
    host = container_config(spec(pipe="/run/fleet-mps/GPU-1/pipe"), "h1")["host"]
    assert host["ipc_mode"] == "host"
    assert host["binds"] == {
        "/run/fleet-mps/GPU-1/pipe": {"bind": "/run/fleet-mps/GPU-1/pipe", "mode": "ro"}
    }


@pytest.mark.parametrize("user", ["root", "0", "0:0", "root:root", "000"])
def test_a_root_user_is_refused_unless_the_policy_allows_root(user):
    with pytest.raises(StartError, match="refusing to run the container as root"):
        container_config(spec({"user": user}), "h1")
    assert container_config(spec({"user": user, "allow_root": True}), "h1")["user"] == user


def test_an_http_check_without_the_hosts_network_publishes_its_port_on_the_bridge():
    http = {**exec_health(), "http": {"port": 8000, "path": "/health"}}
    del http["exec"]
    with pytest.raises(StartError, match="no host port for health"):
        container_config(spec(health=http), "h1")
    bridged = container_config(replace(spec(health=http), host_ports={"health": 20005}), "h1")
    assert bridged["host"]["network_mode"] == "fleet"
    assert bridged["host"]["port_bindings"] == {"8000/tcp": ("127.0.0.1", 20005)}
    on_host = container_config(spec({"host_network": True}, health=http), "h1")
    assert on_host["host"]["network_mode"] == "host" and on_host["host"]["port_bindings"] == {}


def test_a_pinned_digest_is_read_from_the_reference():
    assert pinned_digest(f"{IMAGE}@{DIGEST}") == DIGEST
    assert pinned_digest(IMAGE) is None


class FakeApi:
    """The few Engine API calls a start makes; images by reference."""

    def __init__(self, images: dict[str, dict[str, Any]], pull_error: str | None = None):
        self.images = images
        self.pull_error = pull_error
        self.pulled: list[str] = []
        self.created: list[dict[str, Any]] = []

    # docker.DockerClient.images.pull
    def pull(self, image: str) -> None:
        self.pulled.append(image)
        if self.pull_error:
            raise docker.errors.APIError(self.pull_error)

    def inspect_image(self, image: str) -> dict[str, Any]:
        if image not in self.images:
            raise docker.errors.ImageNotFound(f"no such image: {image}")
        return self.images[image]

    def inspect_container(self, name: str) -> dict[str, Any]:
        if name.startswith("fleet-"):
            raise docker.errors.NotFound("no such container")
        return {"State": {"Status": "running", "Pid": 42, "StartedAt": None}}

    def create_host_config(self, **kwargs: Any) -> dict[str, Any]:
        return kwargs

    def create_container(self, **kwargs: Any) -> dict[str, str]:
        self.created.append(kwargs)
        return {"Id": "c1"}

    def start(self, container_id: str) -> None:
        pass


def fake_runtime(api: FakeApi, image_pull="always") -> DockerRuntime:
    runtime = object.__new__(DockerRuntime)
    runtime.hostname, runtime.image_pull, runtime._log_config = "h1", image_pull, None
    runtime.network, runtime.publish_address, runtime._network_ready = "fleet", "127.0.0.1", True
    runtime._api = api  # type: ignore[assignment]
    runtime._docker = type("Client", (), {"images": api})()  # type: ignore[assignment]
    return runtime


def test_the_image_is_pulled_before_every_start():
    api = FakeApi({IMAGE: {"Id": "sha256:b", "Config": {"User": "1000"}}})
    fake_runtime(api).start(spec())
    assert api.pulled == [IMAGE] and len(api.created) == 1


def test_if_not_present_uses_a_local_image_without_pulling():
    api = FakeApi({IMAGE: {"Id": "sha256:b", "Config": {"User": ""}}}, pull_error="no registry")
    fake_runtime(api, "if-not-present").start(spec())
    assert api.pulled == [] and len(api.created) == 1


def test_when_the_pull_fails_a_local_image_runs_only_if_its_digest_is_pinned():
    pinned = f"{IMAGE}@{DIGEST}"
    local = {"Id": "sha256:b", "RepoDigests": [f"registry.example/team-a/model@{DIGEST}"]}
    api = FakeApi({IMAGE: local, pinned: local}, pull_error="registry unreachable")
    with pytest.raises(StartError, match=r"cannot pull the image .*registry unreachable"):
        fake_runtime(api).start(spec())
    fake_runtime(api).start(spec(image=pinned))
    assert [c["image"] for c in api.created] == [pinned]
    other = f"{IMAGE}@sha256:{'c' * 64}"
    api.images[other] = local  # the tag moved: the local image is not the pinned one
    with pytest.raises(StartError, match="cannot pull"):
        fake_runtime(api).start(spec(image=other))


@pytest.mark.parametrize("image_user", ["", "root", "0", "0:0"])
def test_an_image_that_runs_as_root_is_refused_without_a_user(image_user):
    api = FakeApi({IMAGE: {"Id": "sha256:b", "Config": {"User": image_user}}})
    unset = spec({"user": None})
    with pytest.raises(StartError) as error:
        fake_runtime(api).start(unset)
    assert str(error.value) == ROOT_IMAGE
    assert api.created == []
    fake_runtime(api).start(replace(unset, security={**unset.confinement(), "allow_root": True}))
    assert len(api.created) == 1


def test_an_image_with_a_user_of_its_own_runs_as_it():
    api = FakeApi({IMAGE: {"Id": "sha256:b", "Config": {"User": "app"}}})
    fake_runtime(api).start(spec({"user": None}))
    assert api.created[0]["user"] == ""
