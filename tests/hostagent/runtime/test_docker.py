"""The Docker runtime against the real Docker Engine and the local busybox image."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from dataclasses import replace

import pytest

from hostagent.protocol import workload_environment
from hostagent.runtime import ReplicaSpec, StartError
from hostagent.runtime.docker import DockerRuntime, container_config, gpu_request
from hostagent.runtime.health import http_check
from hostagent.runtime.output import NoOutput
from tests.hostagent.runtime.conftest import IMAGE
from tests.hostagent.runtime.fakes import wait_for, workload
from tests.hostagent.runtime.test_health import free_port

MIG = "MIG-7d5bd3e0-5a4c-5d6e-9b4e-2f1c0a9e8d7c"


def container_spec(allocation_id=11, *, gpu_request=False, pipe=None, **changes) -> ReplicaSpec:
    changes.setdefault(
        "command", ["sh", "-c", "env; trap 'exit 0' TERM; while :; do sleep 0.05; done"]
    )
    environment = workload_environment(
        device_uuid=MIG,
        allocation_id=allocation_id,
        deployment="qwen-7b",
        replica=2,
        mps_pipe_directory=pipe,
        mps_memory_mib=4096 if pipe else None,
        mps_compute_percent=30 if pipe else None,
    )
    return ReplicaSpec(
        allocation_id=allocation_id,
        key=f"a{allocation_id}",
        gpu_uuid="GPU-1",
        deployment="qwen-7b",
        replica=2,
        workload=workload("container", **{"image": IMAGE, **changes}),
        device_uuid=MIG,
        environment=environment,
        mps_pipe_directory=pipe,
        gpu_request=gpu_request,
    )


@pytest.fixture
def runtime(docker_host):
    rt = DockerRuntime(docker_host, image_pull="if-not-present")
    yield rt
    rt.close()


def env_of(docker_client, container_id) -> dict[str, str]:
    logs = wait_for(lambda: docker_client.containers.get(container_id).logs().decode())
    return dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)


def test_a_replicas_container_carries_its_labels_environment_and_the_restricted_profile(
    runtime, docker_client, docker_host
):
    running = runtime.start(container_spec(env={"MODEL": "qwen-7b"}))
    attrs = docker_client.api.inspect_container(running.ident)
    assert attrs["State"]["Running"] and running.pid == attrs["State"]["Pid"]
    labels = attrs["Config"]["Labels"]
    assert labels["fleet.allocation"] == "11"
    assert labels["fleet.deployment"] == "qwen-7b"
    assert labels["fleet.host"] == docker_host
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none" and host["IpcMode"] == "private"
    assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"]
    assert host["PidsLimit"] == 4096
    assert attrs["Config"]["User"] == "65534:65534"
    assert attrs["HostConfig"]["RestartPolicy"]["Name"] in ("", "no")  # the agent restarts
    assert not attrs["HostConfig"].get("DeviceRequests")  # simulated backend: no device
    env = env_of(docker_client, running.ident)
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == MIG
    assert (env["FLEET_ALLOCATION_ID"], env["FLEET_DEPLOYMENT"], env["FLEET_REPLICA"]) == (
        "11",
        "qwen-7b",
        "2",
    )
    assert env["MODEL"] == "qwen-7b"


def test_a_replica_of_several_gpus_asks_docker_for_all_of_them(docker_host):
    both = "GPU-00000000-0000-0000-0000-000000000001,GPU-00000000-0000-0000-0000-000000000002"
    spec = replace(container_spec(gpu_request=True), device_uuid=both)
    [request] = container_config(spec, docker_host)["host"]["device_requests"]
    assert dict(request)["DeviceIDs"] == both.split(",")  # docker run --gpus '"device=a,b"'


def test_on_nvml_the_container_asks_for_its_device_as_docker_run_gpus_does(docker_host):
    spec = container_spec(gpu_request=True)
    [request] = container_config(spec, docker_host)["host"]["device_requests"]
    assert dict(request) == gpu_request(MIG)
    assert dict(request) == {
        "Driver": "nvidia",
        "Count": 0,
        "DeviceIDs": [MIG],
        "Capabilities": [["gpu"]],
        "Options": {},
    }
    cli = shutil.which("docker")
    if cli is None:
        return
    name = f"{docker_host}-cli"
    subprocess.run(
        [cli, "create", "--name", name, "--gpus", f"device={MIG}", IMAGE, "true"],
        check=True,
        capture_output=True,
    )
    try:
        inspected = subprocess.run(
            [cli, "inspect", "-f", "{{json .HostConfig.DeviceRequests}}", name],
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        subprocess.run([cli, "rm", "-f", name], capture_output=True)
    import json

    [by_cli] = json.loads(inspected.stdout)
    for field in ("Count", "DeviceIDs", "Capabilities"):
        assert by_cli[field] == request[field]


def test_without_an_nvidia_runtime_a_gpu_container_fails_with_dockers_reason(runtime):
    with pytest.raises(StartError, match="nvidia"):
        runtime.start(container_spec(gpu_request=True))


def test_an_mps_share_gets_ipc_host_the_pipe_directory_and_its_limits(
    runtime, docker_client, tmp_path
):
    pipe = str(tmp_path / "mps" / "pipe")
    running = runtime.start(container_spec(pipe=pipe))
    attrs = docker_client.api.inspect_container(running.ident)
    assert attrs["HostConfig"]["IpcMode"] == "host"
    assert f"{pipe}:{pipe}:ro" in attrs["HostConfig"]["Binds"]
    env = env_of(docker_client, running.ident)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"


def test_stop_ends_the_container_within_its_grace_period(runtime):
    stubborn = runtime.start(container_spec(command=["sleep", "60"]))  # PID 1 ignores SIGTERM
    started = time.monotonic()
    assert runtime.stop(stubborn, grace_s=1).exit_code == 137
    assert time.monotonic() - started < 1 + 5
    polite = runtime.start(container_spec(12))
    time.sleep(0.2)
    assert runtime.stop(polite, grace_s=30).exit_code == 0


def test_an_exit_is_observed_with_its_code(runtime):
    running = runtime.start(container_spec(command=["sh", "-c", "exit 3"]))
    ended = wait_for(lambda: runtime.observe([running]).get(running.ident))
    assert ended.exit_code == 3


def test_a_missing_image_that_cannot_be_pulled_fails_with_the_reason(runtime):
    with pytest.raises(
        StartError,
        match=r"cannot pull the image registry\.invalid/llm:1\.2",
    ):
        runtime.start(container_spec(image="registry.invalid/llm:1.2"))


def test_a_restarted_agent_finds_this_hosts_containers_and_no_others(
    runtime, docker_host, docker_client
):
    live = runtime.start(container_spec(11))
    gone = runtime.start(container_spec(12, command=["sh", "-c", "exit 3"]))
    wait_for(lambda: runtime.observe([gone]))
    other = DockerRuntime(f"{docker_host}-other", image_pull="if-not-present")
    try:
        assert other.find() == []
    finally:
        other.close()
    again = DockerRuntime(docker_host, image_pull="if-not-present")
    found = {f.running.allocation_id: f for f in again.find()}
    again.close()
    assert found[11].exit is None and found[11].running.ident == live.ident
    assert found[11].running.gpu_uuid == "GPU-1" and found[11].running.stop_grace_s == 30
    assert found[12].exit.exit_code == 3


def test_an_exec_check_runs_inside_the_container(runtime):
    spec = container_spec()
    running = runtime.start(spec)
    inside = ["sh", "-c", f'test "$CUDA_VISIBLE_DEVICES" = {MIG} && test -x /bin/busybox']
    assert runtime.exec_check(running, spec, inside, timeout_s=5) == 0
    assert runtime.exec_check(running, spec, ["sh", "-c", "exit 2"], timeout_s=5) == 2
    with pytest.raises(TimeoutError):
        runtime.exec_check(running, spec, ["sleep", "3"], timeout_s=0.3)


def logs_once_written(runtime, allocation_id: int, tail: int):
    """The container's last lines, or None while it has written nothing yet (Docker says so
    until its logging driver has taken a first line: the container may not have run yet)."""
    try:
        return runtime.logs(allocation_id, tail)
    except NoOutput as exc:
        if "no output yet" in str(exc):
            return None
        raise


def test_the_last_lines_of_a_containers_stdout_and_stderr_are_read(runtime):
    # Docker copies stdout and stderr apart: their order is known only a while apart.
    command = [
        "sh",
        "-c",
        "for i in 1 2 3 4; do echo out $i; done; sleep 0.5; echo err >&2; sleep 30",
    ]
    running = runtime.start(container_spec(12, command=command))
    wait_for(lambda: (o := logs_once_written(runtime, 12, 3)) and o.lines[-1:] == ["err"], 15)
    out = runtime.logs(12, 3)
    assert out.lines == ["out 3", "out 4", "err"] and out.truncated
    whole = runtime.logs(12, 100)
    assert whole.lines == [*(f"out {i}" for i in range(1, 5)), "err"] and not whole.truncated
    runtime.stop(running, 0)
    assert runtime.logs(12, 1).lines == ["err"]  # an ended container keeps its output


def test_a_replica_without_a_container_or_without_output_has_no_lines(runtime):
    with pytest.raises(NoOutput, match="no container"):
        runtime.logs(404, 10)
    runtime.start(container_spec(13, command=["sleep", "30"]))
    with pytest.raises(NoOutput, match="no output yet"):
        runtime.logs(13, 10)


def test_a_declared_port_is_published_on_the_replicas_host_port_and_named_in_its_env(
    runtime, docker_client
):
    host_port = free_port()
    serve = "env; mkdir -p /tmp/w && echo ok > /tmp/w/index.html && exec httpd -f -p 8080 -h /tmp/w"
    spec = replace(
        container_spec(command=["sh", "-c", serve], ports=[{"name": "http", "port": 8080}]),
        host_ports={"http": host_port},
    )
    running = runtime.start(spec)
    attrs = docker_client.api.inspect_container(running.ident)
    assert attrs["HostConfig"]["NetworkMode"] == "fleet"
    assert attrs["HostConfig"]["PortBindings"] == {
        "8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(host_port)}]
    }
    assert attrs["Config"]["Labels"]["fleet.host-ports"] == f'{{"http": {host_port}}}'
    env = env_of(docker_client, running.ident)
    assert (env["PORT"], env["FLEET_PORT_HTTP"]) == ("8080", "8080")
    assert env["FLEET_HOST_PORT_HTTP"] == str(host_port)
    # Served through the published port (Docker's userland proxy: dockerd --iptables=false),
    # and at the container's own address, where the health checks go.
    wait_for(lambda: http_check(host_port, "/index.html", 1) is None)
    assert running.address and http_check(8080, "/index.html", 1, running.address) is None
    # A restarted agent finds the ports on the container.
    [found] = [f for f in runtime.find() if f.running.ident == running.ident]
    assert found.running.host_ports == {"http": host_port}
    assert found.running.address == running.address


def test_a_container_that_declares_no_port_has_no_network():
    config = container_config(container_spec(), "h")
    assert config["host"]["network_mode"] == "none" and config["host"]["port_bindings"] == {}


def test_a_declared_port_without_its_host_port_is_not_started():
    with pytest.raises(StartError, match="no host port for http"):
        container_config(container_spec(ports=[{"name": "http", "port": 8080}]), "h")


def test_two_networks_of_one_name_made_by_racing_agents_become_one(docker_host, docker_client):
    """The Engine lets two agents that race to create the bridge network make two of one name;
    a container then cannot join either ("network ... is ambiguous"). The oldest stays."""
    name = f"{docker_host}-net"
    first = docker_client.api.create_network(name, driver="bridge")["Id"]
    second = docker_client.api.create_network(name, driver="bridge")["Id"]
    try:
        runtime = DockerRuntime(docker_host, image_pull="if-not-present", network=name)
        runtime._ensure_network()
        left = [n["Id"] for n in docker_client.api.networks(names=[name]) if n["Name"] == name]
        assert left == [first] and second not in left
        runtime.close()
    finally:
        for network in (first, second):
            with contextlib.suppress(Exception):
                docker_client.api.remove_network(network)
