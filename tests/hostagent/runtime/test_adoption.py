"""An agent killed with SIGKILL and started again from the same state directory: every workload
is still there exactly once and reported running; one it was never given is stopped only once
the control plane has spoken."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostagent.protocol import LABEL_ALLOCATION, LABEL_HOST
from hostagent.runtime import ReplicaSpec
from tests.hostagent.runtime.conftest import IMAGE
from tests.hostagent.runtime.fakes import wait_for, workload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


class ChildAgent:
    def __init__(self, state_dir, hostname, runtime):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.hostagent.runtime.agent_child",
                *("--state-dir", str(state_dir), "--hostname", hostname, "--runtime", runtime),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
        )

    def call(self, op, **args):
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def states(self):
        return {w["allocation_id"]: w for w in self.call("report")["workloads"]}

    def kill(self):
        self.proc.kill()
        self.proc.wait()


def replica(allocation_id: int, runtime: str) -> dict:
    command = ["sh", "-c", "exec sleep 300"]
    ports = [{"name": "http", "port": 8080}]
    w = (
        workload("container", image=IMAGE, command=command, stop_grace_s=1, ports=ports)
        if runtime == "docker"
        else workload("process", command=command, stop_grace_s=1, ports=ports)
    )
    spec = ReplicaSpec(
        allocation_id=allocation_id,
        key=f"a{allocation_id}",
        gpu_uuid="GPU-1",
        deployment="qwen-7b",
        replica=allocation_id,
        workload=w,
        device_uuid=f"MIG-{allocation_id}",
        environment={"FLEET_ALLOCATION_ID": str(allocation_id)},
    )
    return dataclasses.asdict(spec)


def workload_instances(runtime: str, hostname: str, docker_client) -> dict[int, list[str]]:
    """What really runs per allocation: container IDs by label, or process PIDs by the
    allocation in their environment."""
    found: dict[int, list[str]] = {}
    if runtime == "docker":
        for c in docker_client.containers.list(filters={"label": f"{LABEL_HOST}={hostname}"}):
            found.setdefault(int(c.labels[LABEL_ALLOCATION]), []).append(c.id)
        return found
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline.startswith(b"sleep\x00300") and f"STATE_TAG={hostname}".encode() in environ:
            tag = [e for e in environ if e.startswith(b"FLEET_ALLOCATION_ID=")]
            found.setdefault(int(tag[0].split(b"=")[1]), []).append(pid)
    return found


@pytest.fixture(params=["process", "docker"])
def runtime(request):
    if request.param == "docker":
        request.getfixturevalue("docker_client")
    return request.param


@pytest.fixture
def hostname(runtime, request):
    if runtime == "docker":
        return request.getfixturevalue("docker_host")
    return f"proc-{os.getpid()}-{time.monotonic_ns()}"


@pytest.fixture
def cleanup(tmp_path, kill_sessions):
    children = []
    yield children
    for child in children:
        child.kill()
    state = tmp_path / "state" / "processes.json"
    if state.exists():
        for entry in json.loads(state.read_text())["processes"].values():
            kill_sessions.append(entry["pid"])


def test_a_killed_agent_adopts_everything_exactly_once_and_stops_orphans_only_when_told(
    runtime, hostname, tmp_path, cleanup, request
):
    docker_client = request.getfixturevalue("docker_client") if runtime == "docker" else None
    state_dir = tmp_path / "state"
    specs = [replica(i, runtime) for i in (1, 2, 3, 4)]
    for spec in specs:
        spec["workload"]["env"] = {"STATE_TAG": hostname}
    first = ChildAgent(state_dir, hostname, runtime)
    cleanup.append(first)
    first.call("place", gpu="GPU-1", specs=specs)
    first.call("authorize", gpus=["GPU-1"])
    wait_for(
        lambda: (
            all(w["state"] == "running" for w in first.states().values())
            and len(first.states()) == 4
        ),
        timeout_s=15,
    )
    before = workload_instances(runtime, hostname, docker_client)
    assert sorted(before) == [1, 2, 3, 4] and all(len(v) == 1 for v in before.values())
    ports = {i: w["ports"] for i, w in first.states().items()}
    assert len({p["http"] for p in ports.values()}) == 4  # a host port of its own each

    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    # Allocation 4 was given by a desired state this state directory no longer remembers.
    saved = state_dir / "replicas.json"
    data = json.loads(saved.read_text())
    data["replicas"] = [r for r in data["replicas"] if r["allocation_id"] != 4]
    saved.write_text(json.dumps(data))

    second = ChildAgent(state_dir, hostname, runtime)  # the control plane is unreachable
    cleanup.append(second)
    states = wait_for(
        lambda: (
            (s := second.states())
            and len(s) == 4
            and all(w["state"] == "running" for w in s.values())
            and s
        ),
        timeout_s=10,
    )
    assert workload_instances(runtime, hostname, docker_client) == before  # same ones, once each
    assert all(w["restarts"] == 0 for w in states.values())
    # With its ports: from the saved specs, and for 4 (not saved) from the workload itself.
    assert {i: w["ports"] for i, w in states.items()} == ports
    time.sleep(0.5)
    assert second.states()[4]["state"] == "running"  # unreachable is not failed
    assert second.call("events") == []

    second.call("place", gpu="GPU-1", specs=specs[:3])  # the control plane answers: 1-3 only
    second.call("authorize", gpus=["GPU-1"])
    wait_for(lambda: 4 not in second.states(), timeout_s=10)
    assert [e["kind"] for e in second.call("events")] == ["orphan_stopped"]
    after = workload_instances(runtime, hostname, docker_client)
    assert after == {k: v for k, v in before.items() if k != 4}
    # Given again without host ports (the control plane knows none): kept, nothing restarted.
    assert {i: w["ports"] for i, w in second.states().items()} == {
        i: p for i, p in ports.items() if i != 4
    }
    assert all(w["restarts"] == 0 for w in second.states().values())
