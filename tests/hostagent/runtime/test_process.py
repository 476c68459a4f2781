"""The process runtime against real subprocesses."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from hostagent.runtime import ProcessRuntime, ReplicaSpec, StartError
from hostagent.runtime.output import NoOutput
from hostagent.runtime.procfs import read_stat
from tests.hostagent.runtime.fakes import wait_for, workload

FLEET_ENV = {
    "CUDA_VISIBLE_DEVICES": "MIG-aaaa",
    "NVIDIA_VISIBLE_DEVICES": "MIG-aaaa",
    "FLEET_ALLOCATION_ID": "5",
}


def process_spec(allocation_id=5, **changes) -> ReplicaSpec:
    return ReplicaSpec(
        allocation_id=allocation_id,
        key=f"a{allocation_id}",
        gpu_uuid="GPU-1",
        deployment="qwen-7b",
        replica=0,
        workload=workload(**changes),
        device_uuid="MIG-aaaa",
        environment=dict(FLEET_ENV),
    )


@pytest.fixture
def runtime(tmp_path, kill_sessions):
    rt = ProcessRuntime(tmp_path / "state", as_agent_user=True)
    original = rt.start

    def start(spec):
        running = original(spec)
        kill_sessions.append(running.pid)
        return running

    rt.start = start  # type: ignore[method-assign]
    return rt


def test_a_process_runs_in_its_own_session_with_only_its_environment(
    runtime, tmp_path, monkeypatch
):
    monkeypatch.setenv("FLEET_AGENT_TOKEN", "secret")
    out = tmp_path / "env.txt"
    spec = process_spec(
        command=["sh", "-c", f"env > {out}; exec sleep 30"], env={"MODEL": "qwen-7b"}
    )
    running = runtime.start(spec)
    wait_for(lambda: out.exists() and "MODEL" in out.read_text())
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert os.getsid(running.pid) == running.pid == os.getpgid(running.pid)
    assert env["MODEL"] == "qwen-7b"
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == "MIG-aaaa"
    assert env["FLEET_ALLOCATION_ID"] == "5"
    assert {"PATH", "HOME", "LANG"} <= set(env)
    assert "FLEET_AGENT_TOKEN" not in env  # nothing of the agent's own environment


def test_stop_sends_sigterm_to_the_group_and_sigkill_after_the_grace_period(runtime):
    polite = runtime.start(process_spec(1, command=["sleep", "30"]))
    started = time.monotonic()
    assert runtime.stop(polite, grace_s=5).exit_code == -15
    assert time.monotonic() - started < 1
    stubborn = runtime.start(process_spec(2, command=["sh", "-c", "trap '' TERM; sleep 30"]))
    time.sleep(0.1)  # let the shell install its trap
    started = time.monotonic()
    assert runtime.stop(stubborn, grace_s=0.5).exit_code == -9
    assert 0.5 <= time.monotonic() - started < 3
    assert read_stat(stubborn.pid) is None or read_stat(stubborn.pid).zombie


def test_an_exit_is_seen_with_its_code_and_the_groups_leftovers_are_killed(runtime):
    running = runtime.start(
        process_spec(command=["sh", "-c", "sleep 30 & echo $! > /dev/null; exit 4"])
    )
    ended = wait_for(lambda: runtime.observe([running]).get(running.ident))
    assert ended.exit_code == 4
    wait_for(
        lambda: (
            not any(
                (s := read_stat(pid)) and s.pgrp == running.pid and not s.zombie
                for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            )
        )
    )


def test_output_goes_to_a_log_in_the_state_directory_that_stays_bounded(tmp_path, kill_sessions):
    runtime = ProcessRuntime(tmp_path, log_max_bytes=1000, as_agent_user=True)
    running = runtime.start(
        process_spec(command=["sh", "-c", "for i in $(seq 500); do echo line $i; done; sleep 30"])
    )
    kill_sessions.append(running.pid)
    log = runtime.log_path(5)
    wait_for(lambda: log.exists() and "line 500" in log.read_text())
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    runtime.maintain()
    assert log.stat().st_size == 0
    assert "line 500" in log.with_name("5.log.1").read_text()


def test_a_restarted_agent_finds_its_process_again_by_pid_and_start_time(runtime, tmp_path):
    running = runtime.start(process_spec(command=["sleep", "30"]))
    state_file = tmp_path / "state" / "processes.json"
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
    again = ProcessRuntime(tmp_path / "state")
    [found] = again.find()
    assert found.exit is None and found.running == running
    assert again.stop(found.running, grace_s=5).exit_code is None  # not its child: unknown
    assert read_stat(running.pid) is None or read_stat(running.pid).zombie


def test_a_reused_pid_is_not_taken_for_the_workload(runtime, tmp_path):
    running = runtime.start(process_spec(command=["sleep", "30"]))
    state_file = tmp_path / "state" / "processes.json"
    data = json.loads(state_file.read_text())
    entry = data["processes"]["5"]
    entry["start_ticks"] -= 1
    entry["ident"] = f"{running.pid}:{entry['start_ticks']}"
    state_file.write_text(json.dumps(data))
    [found] = ProcessRuntime(tmp_path / "state").find()
    assert found.exit is not None  # same PID, another start time: not ours
    assert read_stat(running.pid) is not None  # and it was not signalled


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_it_runs_as_the_given_user_and_group_in_the_given_directory(runtime):
    running = runtime.start(
        process_spec(command=["sleep", "30"], user="nobody:nogroup", cwd="/tmp")
    )
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{running.pid}/status").read_text().splitlines()
    )
    assert status["Uid"].split()[0] == "65534"
    assert status["Gid"].split()[0] == "65534"
    assert os.readlink(f"/proc/{running.pid}/cwd") == "/tmp"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"command": ["/nonexistent/serve"]}, "command not found: '/nonexistent/serve'"),
        ({"user": "no-such-user"}, "no such user on this host: 'no-such-user'"),
        ({"user": "nobody:no-such-group"}, "no such group on this host: 'no-such-group'"),
        ({"cwd": "/nonexistent"}, "cannot enter the working directory '/nonexistent'"),
    ],
)
def test_a_process_that_cannot_start_says_why(runtime, changes, message):
    with pytest.raises(StartError) as error:
        runtime.start(process_spec(**changes))
    assert str(error.value).startswith(message)


def test_an_exec_check_runs_beside_the_process_with_its_environment(runtime):
    spec = process_spec(command=["sleep", "30"])
    running = runtime.start(spec)
    ok = ["sh", "-c", 'test "$CUDA_VISIBLE_DEVICES" = MIG-aaaa']
    assert runtime.exec_check(running, spec, ok, timeout_s=5) == 0
    assert runtime.exec_check(running, spec, ["sh", "-c", "exit 3"], timeout_s=5) == 3
    with pytest.raises(TimeoutError):
        runtime.exec_check(running, spec, ["sleep", "5"], timeout_s=0.2)


def test_the_last_lines_of_a_process_output_are_read_from_its_log(runtime):
    command = ["sh", "-c", "for i in 1 2 3 4 5; do echo out $i; done; echo err >&2; sleep 30"]
    runtime.start(process_spec(7, command=command))
    out = wait_for(lambda: (o := runtime.logs(7, 3)).lines[-1:] == ["err"] and o)
    assert out.lines == ["out 4", "out 5", "err"] and out.truncated
    runtime.maintain()  # nothing rotates under the limit
    assert runtime.logs(7, 100).lines == [*(f"out {i}" for i in range(1, 6)), "err"]


def test_after_a_rotation_the_rotated_copy_completes_a_short_log(tmp_path, kill_sessions):
    runtime = ProcessRuntime(tmp_path / "state", log_max_bytes=10, as_agent_user=True)
    running = runtime.start(process_spec(8, command=["sh", "-c", "echo first; echo second"]))
    kill_sessions.append(running.pid)
    wait_for(lambda: runtime.logs(8, 10).lines == ["first", "second"])
    runtime.maintain()  # copied to 8.log.1, 8.log emptied
    runtime.log_path(8).write_text("third\n")
    out = runtime.logs(8, 2)
    assert out.lines == ["second", "third"] and out.truncated


def test_a_replica_without_a_log_has_no_output(runtime):
    with pytest.raises(NoOutput, match="no output yet"):
        runtime.logs(99, 10)
