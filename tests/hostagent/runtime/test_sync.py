"""Desired states applied on a simulated GPU with real workloads: each replica starts on the
slice it was given, with that slice's UUID, and stops when it is evicted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hostagent.mps import MpsLimits
from hostagent.protocol import LogsRequest, default_workload
from hostagent.runtime import ProcessRuntime, replica_specs
from hostagent.runtime.docker import DockerRuntime
from tests.hostagent.runtime.conftest import IMAGE
from tests.hostagent.runtime.fakes import wait_for, workload
from tests.hostagent.runtime.kit import allocation, desired, make_host

ANNOUNCE = (
    "echo device=$CUDA_VISIBLE_DEVICES; env; trap 'exit 0' TERM; while :; do sleep 0.05; done"
)


@pytest.fixture(params=["container", "process"])
def host(request, tmp_path, kill_sessions):
    """An agent with the docker runtime (containers) or the process runtime."""
    process = ProcessRuntime(tmp_path / "workloads", as_agent_user=True)
    runtimes = {"process": process}
    if request.param == "container":
        runtimes["container"] = DockerRuntime(
            request.getfixturevalue("docker_host"), image_pull="if-not-present"
        )
    made = make_host(tmp_path, runtimes, "docker" if request.param == "container" else "process")
    made.kind = request.param
    yield made
    made.supervisor.close()
    for entry in process.find():
        kill_sessions.append(entry.running.pid)


def replica_workload(kind: str, **changes):
    command = ["sh", "-c", ANNOUNCE]
    if kind == "container":
        return workload("container", image=IMAGE, command=command, **changes)
    return workload("process", command=command, **changes)


def output_of(host, allocation_id: int, docker_client=None) -> str:
    if host.kind == "container":
        running = host.supervisor._replicas[allocation_id].running
        return host.sync.supervisor.runtimes["container"]._api.logs(running.ident).decode()
    return (host.supervisor.runtimes["process"].log_path(allocation_id)).read_text()


def test_a_placed_replica_runs_on_its_mig_slice_and_an_eviction_stops_it(host, request):
    host.apply(desired(host.gpu, 1, [allocation(7, replica_workload(host.kind, stop_grace_s=3))]))
    wait_for(lambda: host.state(7) == "running")
    mig = host.mig_uuid(5, 0)
    expected = (f"device={mig}", f"NVIDIA_VISIBLE_DEVICES={mig}", "FLEET_ALLOCATION_ID=7")
    expected += ("FLEET_DEPLOYMENT=qwen-7b",)
    # The workload writes its lines one by one: wait for all of them, not only the first.
    wait_for(lambda: (text := output_of(host, 7)) and all(e in text for e in expected))
    if host.kind == "container":
        docker_host = request.getfixturevalue("docker_host")
        running = host.supervisor._replicas[7].running
        labels = host.supervisor.runtimes["container"]._api.inspect_container(running.ident)[
            "Config"
        ]["Labels"]
        assert (labels["fleet.allocation"], labels["fleet.deployment"], labels["fleet.host"]) == (
            "7",
            "qwen-7b",
            docker_host,
        )
    host.supervisor.take_report(full=True)

    started = time.monotonic()
    host.apply(desired(host.gpu, 2, []))  # evicted; the layout stays
    assert time.monotonic() - started < 1  # a plain eviction does not hold the ack
    wait_for(lambda: host.state(7) is None, timeout_s=3 + 5)
    report = host.supervisor.take_report(full=False)
    assert [(w["allocation_id"], w["state"]) for w in report["workloads"]][-1] == (7, "none")


def test_a_reshape_waits_for_the_workload_before_destroying_its_partition(tmp_path, kill_sessions):
    host = make_host(
        tmp_path, {"process": ProcessRuntime(tmp_path / "w", as_agent_user=True)}, "process"
    )
    try:
        # It says when it ignores SIGTERM: "running" comes at the spawn, before the shell has
        # set its trap, and a SIGTERM then ends it at once (seen on a loaded CI machine).
        ready = tmp_path / "trapped"
        stubborn = workload(
            "process",
            command=["sh", "-c", f"trap '' TERM; touch {ready}; sleep 30"],
            stop_grace_s=1,
        )
        host.apply(desired(host.gpu, 1, [allocation(7, stubborn)]))
        wait_for(lambda: host.state(7) == "running" and ready.exists())
        pid = host.supervisor._replicas[7].running.pid
        kill_sessions.append(pid)
        started = time.monotonic()
        items = host.apply(desired(host.gpu, 2, [], instances=()))
        assert 1 <= time.monotonic() - started < 1 + 5
        assert all(i["status"] == "ok" for i in items), items
        assert host.state(7) is None and host.sim.mig_instances(host.gpu) == []
    finally:
        host.supervisor.close()


def test_an_mps_share_gets_the_pipe_directory_and_the_shares_limits(tmp_path, kill_sessions):
    host = make_host(
        tmp_path, {"process": ProcessRuntime(tmp_path / "w", as_agent_user=True)}, "process"
    )
    try:
        share = allocation(
            3,
            workload("process", command=["sh", "-c", ANNOUNCE]),
            partition_key=None,
            memory_mib=4096,
            max_compute_percent=30,
        )
        host.apply(desired(host.gpu, 1, [share], instances=(), mig=False, mps=True))
        wait_for(lambda: host.state(3) == "running")
        kill_sessions.append(host.supervisor._replicas[3].running.pid)
        log = host.supervisor.runtimes["process"].log_path(3)
        out = wait_for(lambda: log.exists() and "CUDA_MPS" in log.read_text() and log.read_text())
        pipe = host.mps.daemon(host.gpu).pipe_directory
        assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in out
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M" in out
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in out
        assert f"CUDA_VISIBLE_DEVICES={host.gpu}" in out
    finally:
        host.supervisor.close()


def environ_of(pid: int) -> dict[str, str]:
    """A process's environment as CUDA reads it at init (``/proc/<pid>/environ``)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)


def test_a_replica_that_re_exports_its_mps_limits_higher_still_gets_its_shares(
    tmp_path, kill_sessions
):
    """The review's M2: the share's limits are the MPS daemon's (the server's), which a
    client's CUDA_MPS_* can only lower; the simulated daemon applies them as MPS does."""
    host = make_host(
        tmp_path, {"process": ProcessRuntime(tmp_path / "w", as_agent_user=True)}, "process"
    )
    raise_limits = (
        "export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=81920M CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100; "
        "exec sleep 30"
    )
    try:
        share = allocation(
            3,
            workload("process", command=["sh", "-c", raise_limits]),
            partition_key=None,
            memory_mib=4096,
            max_compute_percent=30,
        )
        host.apply(desired(host.gpu, 1, [share], instances=(), mig=False, mps=True))
        wait_for(lambda: host.state(3) == "running")
        pid = host.supervisor._replicas[3].running.pid
        kill_sessions.append(pid)
        env = wait_for(
            lambda: (e := environ_of(pid)).get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "100" and e
        )
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=81920M"  # it did raise them
        client = host.sim.run_process(host.gpu, 100, env=env)  # its CUDA init, on the fake
        assert host.sim.mps_limits(client) == MpsLimits(30, 4096)
        assert host.mps.limits(host.gpu) == MpsLimits(30, 4096)
    finally:
        host.supervisor.close()


def test_specs_name_the_mig_instance_and_its_own_mps_daemon(tmp_path):
    host = make_host(tmp_path, {}, "none")
    state = desired(host.gpu, 1, [allocation(4, workload(), memory_mib=2048)], instances=((5, 2),))
    state["gpus"][host.gpu]["instances"][0]["mps"] = {
        "enabled": True,
        "per_instance": True,
        "default_active_thread_percentage": None,
        "default_pinned_mem_limit_mib": None,
    }
    host.apply(state)
    [spec] = replica_specs(host.sim, host.mps, host.gpu, state["gpus"][host.gpu], gpu_request=True)
    mig = host.mig_uuid(5, 2)
    assert spec.device_uuid == mig and spec.gpu_request
    assert spec.mps_pipe_directory == str(host.mps.daemon(mig).pipe_directory)
    assert spec.environment["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in spec.environment  # none asked for


def test_a_replica_of_several_gpus_runs_once_with_every_gpu_visible(tmp_path):
    """The allocation that carries ``devices`` runs, seeing them all; the replica's other
    GPUs' allocations run nothing."""
    host = make_host(tmp_path, {}, "none")
    devices = [host.gpu, "GPU-00000000-0000-0000-0000-00000000beef"]
    state = desired(
        host.gpu,
        1,
        [
            allocation(4, workload(), partition_key=None, devices=devices),
            allocation(5, default_workload(), partition_key=None),
        ],
    )
    [spec] = replica_specs(host.sim, host.mps, host.gpu, state["gpus"][host.gpu], gpu_request=True)
    assert spec.allocation_id == 4
    assert spec.device_uuid == ",".join(devices)
    assert spec.environment["CUDA_VISIBLE_DEVICES"] == ",".join(devices)
    assert spec.environment["NVIDIA_VISIBLE_DEVICES"] == ",".join(devices)


def test_a_replica_whose_partition_is_missing_waits_for_it(tmp_path):
    host = make_host(tmp_path, {}, "none")
    state = desired(host.gpu, 1, [allocation(4, workload(), partition_key="nowhere")])
    [spec] = replica_specs(host.sim, host.mps, host.gpu, state["gpus"][host.gpu], gpu_request=False)
    assert spec.device_uuid is None and spec.environment == {}


def test_replicas_without_a_workload_are_never_reported(tmp_path):
    host = make_host(tmp_path, {}, "none")
    host.apply(desired(host.gpu, 1, [allocation(4, default_workload())]))
    assert host.supervisor.take_report(full=True)["workloads"] == []


def test_a_bug_in_placing_workloads_costs_neither_the_layout_nor_the_ack(tmp_path, monkeypatch):
    from hostagent.runtime import sync

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in resolving devices")

    monkeypatch.setattr(sync, "replica_specs", broken)
    host = make_host(tmp_path, {}, "none")
    items = host.apply(desired(host.gpu, 1, [allocation(4, workload())]))
    assert items and all(i["status"] == "ok" for i in items)
    assert [(i.profile_id, i.start) for i in host.sim.mig_instances(host.gpu)] == [(5, 0)]


def test_a_logs_request_reads_a_placed_replicas_output_through_its_runtime(host):
    host.apply(desired(host.gpu, 1, [allocation(7, replica_workload(host.kind))]))
    wait_for(lambda: host.state(7) == "running")
    request: LogsRequest = {
        "type": "logs_request",
        "request_id": "r7",
        "allocation_id": 7,
        "tail": 50,
    }
    # The workload writes its lines one after another: wait for the last one it prints.
    answer = wait_for(
        lambda: (
            (a := host.sync.logs(request))["lines"]
            and "device=" in a["lines"][0]
            and "FLEET_ALLOCATION_ID=7" in a["lines"]
            and a
        ),
        15,
    )
    assert answer["lines"][0] == f"device={host.mig_uuid(5, 0)}"
    assert "FLEET_ALLOCATION_ID=7" in answer["lines"] and answer["error"] is None
    assert not answer["truncated"]
