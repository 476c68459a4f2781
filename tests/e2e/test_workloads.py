"""Fleet runs the workloads, end to end with real processes: daphne, a Celery worker and beat on
Redis, PostgreSQL, a ``fleet-agent`` on the simulated backend with a real runtime, and a real
Docker Engine with a locally built image (no registry is reachable here).

A replica placed on a simulated MIG slice runs as a container (or a process) with that slice's
MIG UUID in ``CUDA_VISIBLE_DEVICES``; eviction stops it within its grace; a failing workload is
restarted, then reported in a crash loop; an agent killed with SIGKILL adopts what runs; a
replica whose health check fails is never ``running``; an MPS share's limits are in its
environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fleet.bench.image import ensure_image
from fleet.bench.stack_agent import container_ids
from hostagent.protocol.workloads import RESTART_BACKOFF_S
from tests.e2e.stack import NOBODY, Agent, Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

IMAGE = "fleet-test/busybox:2"
GRACE_S = 3


def _docker_ok() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


def docker(*args: str) -> str:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def containers_of(allocation_id: int) -> list[dict[str, Any]]:
    """Running containers labelled for the allocation, as ``docker inspect`` says."""
    ids = container_ids(allocation_id)  # this run's agents' only
    return json.loads(docker("inspect", *ids)) if ids else []


@pytest.fixture(scope="module")
def image() -> str:
    if not _docker_ok():
        pytest.skip("no Docker daemon answers (.ci/run starts one: dockerd --bridge=none)")
    ensure_image(IMAGE)  # built locally from busybox-static: no registry is reachable
    return IMAGE


@pytest.fixture(scope="module")
def fleet(stack: Stack, image: str) -> tuple[Stack, Agent, dict[str, dict[str, Any]]]:
    agent = stack.add_agent("wl-1", ["h100-sxm5-80gb", "a100-sxm4-40gb"], runtime="docker")
    h100, a100 = stack.gpus(agent)
    for gpu, body in (
        (
            h100,
            {
                "mode": "mig",
                "instances": [
                    {"profile": "3g.40gb", "start": 4},
                    {"profile": "2g.20gb", "start": 0},
                    {"profile": "1g.10gb", "start": 2},
                    {"profile": "1g.10gb", "start": 3},
                ],
            },
        ),
        (a100, {"mode": "mps", "mps": {"default_active_thread_percentage": 100}}),
    ):
        status, op = stack.request("PUT", f"/api/v1/gpus/{gpu['id']}/layout", body)
        assert status == 202, op
        assert stack.wait_operation(op["id"])["status"] == "succeeded"
    wait_until(lambda: stack.converged(h100["id"]), 20, what="the MIG layout")
    return stack, agent, {"h100": h100, "a100": a100}


def partition(stack: Stack, gpu_id: int, profile: str, start: int) -> dict[str, Any]:
    rows = stack.get(f"/api/v1/partitions/?gpu={gpu_id}&limit=100")["results"]
    found = next(p for p in rows if p["profile_name"] == profile and p["start"] == start)
    assert found["uuid"].startswith("MIG-"), found
    return dict(found)


def deploy(stack: Stack, name: str, request: dict[str, Any], workload: dict[str, Any]) -> int:
    body = {"name": name, "replicas": 1, **request, "workload": workload}
    status, created = stack.request("POST", "/api/v1/deployments/", body)
    assert status == 201, created
    return int(created["id"])


def place(stack: Stack, deployment_id: int, **target: Any) -> dict[str, Any]:
    status, op = stack.request("POST", f"/api/v1/deployments/{deployment_id}/place", target)
    assert status in (200, 201, 202), op
    allocations = stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"]
    (allocation,) = allocations
    return dict(allocation)


def allocation(stack: Stack, allocation_id: int) -> dict[str, Any] | None:
    status, body = stack.request("GET", f"/api/v1/allocations/{allocation_id}/")
    return dict(body) if status == 200 else None


def wait_state(stack: Stack, allocation_id: int, state: str, timeout: float = 30) -> dict:
    wait_until(
        lambda: (allocation(stack, allocation_id) or {}).get("workload_state") == state,
        timeout,
        what=f"allocation {allocation_id} {state}",
    )
    found = allocation(stack, allocation_id)
    assert found is not None
    return found


def evict(stack: Stack, deployment_id: int) -> None:
    status, body = stack.request("POST", f"/api/v1/deployments/{deployment_id}/evict", {})
    assert status in (200, 202), body


def test_a_container_runs_on_its_mig_slice_and_stops_within_its_grace(fleet):
    stack, agent, gpus = fleet
    slice_ = partition(stack, gpus["h100"]["id"], "3g.40gb", 4)
    deployment_id = deploy(
        stack,
        "web",
        {"kind": "mig", "profile": "3g.40gb"},
        {
            "runtime": "container",
            "user": NOBODY,
            "image": IMAGE,
            "command": ["sh", "-c", "sleep 3600"],  # PID 1 ignores SIGTERM: SIGKILL after grace
            "env": {"MODEL": "qwen-7b"},
            "stop_grace_s": GRACE_S,
        },
    )
    placed = place(stack, deployment_id, partition=slice_["id"])
    running = wait_state(stack, placed["id"], "running")
    assert running["started_at"] is not None and running["restarts"] == 0

    (container,) = containers_of(placed["id"])
    env = dict(item.split("=", 1) for item in container["Config"]["Env"])
    assert env["CUDA_VISIBLE_DEVICES"] == slice_["uuid"] == env["NVIDIA_VISIBLE_DEVICES"]
    assert env["MODEL"] == "qwen-7b" and env["FLEET_DEPLOYMENT"] == "web"
    assert env["FLEET_ALLOCATION_ID"] == str(placed["id"]) and env["FLEET_REPLICA"] == "0"
    labels = container["Config"]["Labels"]
    assert labels["fleet.allocation"] == str(placed["id"])
    assert (labels["fleet.deployment"], labels["fleet.host"]) == ("web", agent.hostname)
    assert not container["HostConfig"].get("DeviceRequests")  # simulated GPUs: no device request

    started = time.monotonic()
    evict(stack, deployment_id)
    # The slice stays reserved while the workload stops, and is free once it has exited.
    wait_until(lambda: allocation(stack, placed["id"]) is None, GRACE_S + 5, what="slice free")
    assert time.monotonic() - started <= GRACE_S + 5
    assert containers_of(placed["id"]) == []


def test_a_process_runs_with_its_slice_in_its_environment(fleet, tmp_path: Path):
    stack, _, gpus = fleet
    slice_ = partition(stack, gpus["h100"]["id"], "2g.20gb", 0)
    out = tmp_path / "proc"
    out.mkdir()
    out.chmod(0o777)  # the process runs as nobody
    deployment_id = deploy(
        stack,
        "proc",
        {"kind": "mig", "profile": "2g.20gb"},
        {
            "runtime": "process",
            "command": [
                "/bin/sh",
                "-c",
                'env > "$OUT/env"; echo $$ >> "$OUT/starts"; exec sleep 3600',
            ],
            "env": {"OUT": str(out)},
            "stop_grace_s": GRACE_S,
        },
    )
    placed = place(stack, deployment_id, partition=slice_["id"])
    wait_state(stack, placed["id"], "running")
    wait_until(lambda: (out / "starts").exists(), 10, what="the process started")
    env = dict(line.split("=", 1) for line in (out / "env").read_text().splitlines() if "=" in line)
    assert env["CUDA_VISIBLE_DEVICES"] == slice_["uuid"]
    assert env["FLEET_ALLOCATION_ID"] == str(placed["id"])
    assert "FLEET_AGENT_TOKEN" not in env  # nothing of the agent's environment leaks
    pid = int((out / "starts").read_text().split()[0])
    assert Path(f"/proc/{pid}").exists()

    started = time.monotonic()
    evict(stack, deployment_id)
    wait_until(lambda: allocation(stack, placed["id"]) is None, GRACE_S + 5, what="slice free")
    assert time.monotonic() - started <= GRACE_S + 5
    wait_until(lambda: not _alive(pid), 5, what="the process gone")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_failing_workload_is_restarted_then_reported_in_a_crash_loop(fleet):
    stack, agent, gpus = fleet
    crash = deploy(
        stack,
        "crash",
        {"kind": "mig", "profile": "1g.10gb"},
        {"runtime": "process", "command": ["/bin/sh", "-c", "exit 3"], "restart": "on-failure"},
    )
    placed = place(stack, crash, partition=partition(stack, gpus["h100"]["id"], "1g.10gb", 2)["id"])
    looping = wait_state(stack, placed["id"], "crashloop", timeout=90)
    assert looping["exit_code"] == 3 and looping["restarts"] >= 4
    events = stack.get(f"/api/v1/events/?kind=crashloop&host={agent.host_id}")
    assert events["count"] >= 1

    once = deploy(
        stack,
        "once",
        {"kind": "mig", "profile": "1g.10gb"},
        {"runtime": "process", "command": ["/bin/sh", "-c", "exit 7"], "restart": "never"},
    )
    placed = place(stack, once, partition=partition(stack, gpus["h100"]["id"], "1g.10gb", 3)["id"])
    exited = wait_state(stack, placed["id"], "exited")
    assert exited["exit_code"] == 7 and exited["restarts"] == 0
    # Real timing, not a barrier: a restart would come after the first backoff (1 s), and
    # nothing observable marks "the supervisor decided not to": three backoffs, then look.
    time.sleep(3 * RESTART_BACKOFF_S[0])
    assert allocation(stack, placed["id"])["workload_state"] == "exited"  # never restarted
    for deployment_id in (crash, once):
        evict(stack, deployment_id)


def test_an_agent_killed_with_sigkill_adopts_every_workload_exactly_once(fleet, tmp_path: Path):
    stack, agent, gpus = fleet
    out = tmp_path / "adopt"
    out.mkdir()
    out.chmod(0o777)  # the process runs as nobody
    container = deploy(
        stack,
        "adopt-c",
        {"kind": "mig", "profile": "3g.40gb"},
        {
            "runtime": "container",
            "user": NOBODY,
            "image": IMAGE,
            "command": ["sleep", "3600"],
            "stop_grace_s": 1,
        },
    )
    process = deploy(
        stack,
        "adopt-p",
        {"kind": "mig", "profile": "2g.20gb"},
        {
            "runtime": "process",
            "command": ["/bin/sh", "-c", 'echo $$ >> "$OUT/starts"; exec sleep 3600'],
            "env": {"OUT": str(out)},
            "stop_grace_s": 1,
        },
    )
    c = place(stack, container, partition=partition(stack, gpus["h100"]["id"], "3g.40gb", 4)["id"])
    p = place(stack, process, partition=partition(stack, gpus["h100"]["id"], "2g.20gb", 0)["id"])
    before = {a: wait_state(stack, a, "running") for a in (c["id"], p["id"])}
    (box,) = containers_of(c["id"])

    agent.kill()  # SIGKILL: no chance to clean up
    time.sleep(1)
    agent.start(runtime="docker")
    wait_until(
        lambda: stack.get(f"/api/v1/hosts/{agent.host_id}/")["status"] == "ready",
        30,
        what="the agent back",
    )
    time.sleep(3)  # time enough to start a duplicate, were it to
    (again,) = containers_of(c["id"])
    assert again["Id"] == box["Id"]
    assert len((out / "starts").read_text().split()) == 1  # the process was not started again
    for allocation_id, was in before.items():
        now = allocation(stack, allocation_id)
        assert now is not None and now["workload_state"] == "running"
        assert now["restarts"] == was["restarts"] and now["started_at"] == was["started_at"]
    evict(stack, container)
    evict(stack, process)
    wait_until(lambda: allocation(stack, c["id"]) is None, 10, what="container released")
    wait_until(lambda: allocation(stack, p["id"]) is None, 10, what="process released")


def test_a_replica_whose_health_check_fails_is_not_running(fleet):
    stack, _, gpus = fleet
    deployment_id = deploy(
        stack,
        "sick",
        {"kind": "mig", "profile": "1g.10gb"},
        {
            "runtime": "container",
            "user": NOBODY,
            "image": IMAGE,
            "command": ["sleep", "3600"],
            "stop_grace_s": 1,
            "health": {"http": {"port": 1, "path": "/health"}, "interval_s": 1, "timeout_s": 1},
        },
    )
    placed = place(
        stack, deployment_id, partition=partition(stack, gpus["h100"]["id"], "1g.10gb", 2)["id"]
    )
    wait_until(lambda: containers_of(placed["id"]) != [], 20, what="the container up")
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        state = (allocation(stack, placed["id"]) or {}).get("workload_state")
        assert state != "running", "a replica failing its health check was reported running"
        time.sleep(0.5)
    evict(stack, deployment_id)


def test_an_mps_share_runs_with_its_memory_and_compute_limits(fleet):
    stack, _, gpus = fleet
    deployment_id = deploy(
        stack,
        "share",
        {"kind": "mps", "memory_mib": 4096, "max_compute_percent": 25},
        {
            "runtime": "container",
            "user": NOBODY,
            "image": IMAGE,
            "command": ["sleep", "3600"],
            "stop_grace_s": 1,
        },
    )
    placed = place(stack, deployment_id, gpu=gpus["a100"]["id"])
    wait_state(stack, placed["id"], "running")
    (container,) = containers_of(placed["id"])
    env = dict(item.split("=", 1) for item in container["Config"]["Env"])
    assert env["CUDA_VISIBLE_DEVICES"] == gpus["a100"]["uuid"]
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
    assert container["HostConfig"]["IpcMode"] == "host"
    assert any(m["Destination"] == pipe for m in container["Mounts"])
    evict(stack, deployment_id)
    wait_until(lambda: allocation(stack, placed["id"]) is None, 10, what="share released")
    assert os.path.isabs(pipe)


def test_a_replica_of_two_gpus_runs_one_process_that_sees_both(stack: Stack, tmp_path: Path):
    """A replica of 2 whole GPUs is one workload with both GPUs in ``CUDA_VISIBLE_DEVICES``
    (not one per GPU); both GPUs are held while it runs and freed once it has stopped."""
    agent = stack.add_agent("wl-pair", ["h100-sxm5-80gb", "h100-sxm5-80gb"], runtime="process")
    gpus = stack.gpus(agent)
    for gpu in gpus:
        status, op = stack.request("PUT", f"/api/v1/gpus/{gpu['id']}/layout", {"mode": "dedicated"})
        assert status in (200, 202), op  # 200: it was dedicated already
        assert stack.wait_operation(op["id"])["status"] == "succeeded"
    out = tmp_path / "pair"
    out.mkdir()
    out.chmod(0o777)  # the process runs as nobody
    deployment_id = deploy(
        stack,
        "pair-runner",
        {"kind": "gpu", "gpu_count": 2},
        {
            "runtime": "process",
            "command": [
                "/bin/sh",
                "-c",
                'env > "$OUT/env.$$"; echo $$ >> "$OUT/starts"; exec sleep 3600',
            ],
            "env": {"OUT": str(out)},
            "stop_grace_s": GRACE_S,
        },
    )
    status, op = stack.request(
        "POST", f"/api/v1/deployments/{deployment_id}/place", {"gpu": gpus[0]["id"]}
    )
    assert status in (200, 201, 202), op
    rows = stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"]
    assert sorted(r["gpu"] for r in rows) == sorted(g["id"] for g in gpus)
    first, second = sorted(rows, key=lambda r: r["gpu_slot"])
    wait_state(stack, first["id"], "running")
    wait_state(stack, second["id"], "running")  # it follows the replica's workload
    wait_until(lambda: (out / "starts").exists(), 10, what="the process started")
    time.sleep(1)  # a second copy would have started by now, in the same apply
    (pid,) = [int(line) for line in (out / "starts").read_text().split()]
    env = dict(
        line.split("=", 1) for line in (out / f"env.{pid}").read_text().splitlines() if "=" in line
    )
    uuids = {g["id"]: g["uuid"] for g in gpus}
    assert env["CUDA_VISIBLE_DEVICES"] == f"{uuids[first['gpu']]},{uuids[second['gpu']]}"

    evict(stack, deployment_id)
    for row in (first, second):
        wait_until(lambda r=row: allocation(stack, r["id"]) is None, GRACE_S + 10, what="freed")
    wait_until(lambda: not _alive(pid), 5, what="the process gone")
