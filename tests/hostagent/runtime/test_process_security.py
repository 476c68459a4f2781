"""Process workloads are confined (review H1): off unless the agent allows them, never root
without the policy's say, never the agent's own user, in a cgroup with their limits (or with
RLIMIT_NPROC and a word in their log), with nothing of the agent's environment."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hostagent.protocol import Security, default_security
from hostagent.runtime import PROCESS_RUNTIME_OFF, ProcessRuntime, StartError, Supervisor
from hostagent.runtime import process as process_module
from hostagent.runtime.cgroups import Cgroups
from hostagent.runtime.process import can_switch_users, resolve_user
from tests.hostagent.runtime.fakes import wait_for
from tests.hostagent.runtime.kit import FAST
from tests.hostagent.runtime.test_cgroups import fake_cgroup
from tests.hostagent.runtime.test_process import process_spec

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


def security(**changes) -> Security:
    return {**default_security(), **changes}  # type: ignore[typeddict-item]


def confined_spec(allocation_id=5, sec: Security | None = None, **changes):
    spec = process_spec(allocation_id, **changes)
    return replace(spec, security=sec or security(user="nobody"))


@pytest.mark.parametrize("user", ["root", "0", "0:0", "root:nogroup"])
def test_root_is_refused_unless_the_policy_allows_it(user):
    with pytest.raises(StartError, match="refusing to run a process workload as root"):
        resolve_user(user)
    assert resolve_user(user, allow_root=True).uid == 0


def test_a_process_without_a_user_is_refused():
    with pytest.raises(StartError, match="needs a user to run as"):
        resolve_user(None)


def test_the_agents_own_user_is_refused(monkeypatch):
    monkeypatch.setattr(process_module.os, "geteuid", lambda: 1234)
    with pytest.raises(StartError, match=r"the agent's own user \(uid 1234"):
        resolve_user("1234")


def test_an_agent_that_cannot_switch_users_says_so(monkeypatch):
    monkeypatch.setattr(process_module.os, "geteuid", lambda: 1234)
    monkeypatch.setattr(process_module, "can_switch_users", lambda: False)
    with pytest.raises(StartError, match="without CAP_SETUID and CAP_SETGID"):
        resolve_user("65534")


def test_switching_users_needs_root_or_both_setuid_and_setgid_capabilities(monkeypatch):
    monkeypatch.setattr(process_module.os, "geteuid", lambda: 1234)
    both = 1 << 6 | 1 << 7
    assert can_switch_users(f"Name:\tagent\nCapEff:\t{both:016x}\n")
    assert not can_switch_users(f"CapEff:\t{1 << 7:016x}\n")  # CAP_SETUID alone
    assert not can_switch_users("CapEff:\t0000000000000000\n")
    monkeypatch.setattr(process_module.os, "geteuid", lambda: 0)
    assert can_switch_users("CapEff:\t0000000000000000\n")


def test_as_agent_user_a_workload_without_a_user_runs_as_the_agent():
    identity = resolve_user(None, as_agent_user=True)
    assert identity.uid is None and identity.groups is None  # no switch


@as_root
def test_the_switch_keeps_only_the_target_users_groups():
    identity = resolve_user("nobody")
    assert identity.uid == 65534
    assert 0 not in (identity.groups or [])  # none of root's groups


def test_an_agent_without_allow_process_runtime_reports_process_workloads_failed(tmp_path):
    runtime = ProcessRuntime(tmp_path / "state", allow_start=False)
    with pytest.raises(StartError, match="--allow-process-runtime"):
        runtime.start(confined_spec())
    supervisor = Supervisor(
        {"process": runtime}, agent_runtime="process", state_dir=tmp_path, timing=FAST
    )
    supervisor.start()
    try:
        supervisor.place("GPU-1", [confined_spec(command=["sleep", "30"])])
        report = supervisor.take_report(full=True)
        [status] = report["workloads"]
        assert (status["state"], status["message"]) == ("failed", PROCESS_RUNTIME_OFF)
        time.sleep(0.2)
        assert supervisor.states()[5] == "failed"  # and never started
        assert runtime.find() == []
    finally:
        supervisor.close()


@pytest.fixture
def started(kill_sessions):
    def start(runtime: ProcessRuntime, spec):
        running = runtime.start(spec)
        kill_sessions.append(running.pid)
        return running

    return start


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


@pytest.fixture
def open_dir():
    """A directory anyone may enter (pytest's own are root's, 0700): what keeps a workload out
    of the agent's state below it is then the state directory's own mode."""
    path = Path(tempfile.mkdtemp(prefix="fleet-test-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@as_root
def test_a_process_runs_as_its_user_in_its_cgroup_with_its_limits(
    tmp_path, open_dir, started, monkeypatch
):
    monkeypatch.setenv("FLEET_AGENT_TOKEN", "secret")
    base = fake_cgroup(tmp_path / "cg", "/fleet")
    (base / "fleet-7").mkdir()
    (base / "fleet-7" / "cgroup.procs").write_text("")  # cgroupfs makes it with the cgroup
    runtime = ProcessRuntime(open_dir / "state", cgroups=Cgroups(tmp_path / "cg", "/fleet"))
    (open_dir / "state" / "processes.json").write_text("{}")
    out = open_dir / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    command = f"env > {out}/env; cat {open_dir}/state/processes.json > {out}/state 2>&1; sleep 30"
    sec = security(user="nobody", memory_mib=128, pids_limit=64)
    running = started(runtime, confined_spec(7, sec, command=["sh", "-c", command], cwd="/tmp"))
    # the shell makes the file before cat says why it could not read: wait for the words
    wait_for(lambda: (out / "state").exists() and (out / "state").read_text())
    status = proc_status(running.pid)
    assert status["Uid"].split()[0] == status["Gid"].split()[0] == "65534"
    assert status["Groups"].split() == ["65534"]
    assert (base / "fleet-7" / "cgroup.procs").read_text() == "0"  # the child moved itself
    assert (base / "fleet-7" / "memory.max").read_text() == str(128 * 2**20)
    assert (base / "fleet-7" / "pids.max").read_text() == "64"
    assert "Permission denied" in (out / "state").read_text()  # the agent's state is not its
    env = dict(line.split("=", 1) for line in (out / "env").read_text().splitlines() if "=" in line)
    assert "FLEET_AGENT_TOKEN" not in env
    assert env["HOME"] == "/nonexistent" and env["FLEET_ALLOCATION_ID"] == "5"
    assert not runtime.log_path(7).read_text()  # confined: nothing to say


@as_root
def test_without_a_cgroup_the_pids_are_capped_by_rlimit_and_the_log_says_memory_is_not_confined(
    tmp_path, started
):
    runtime = ProcessRuntime(tmp_path / "state", cgroups=Cgroups(tmp_path, "/nowhere"))
    sec = security(user="nobody", memory_mib=128, pids_limit=64)
    running = started(runtime, confined_spec(8, sec, command=["sleep", "30"]))
    limits = Path(f"/proc/{running.pid}/limits").read_text()
    [nproc] = [line for line in limits.splitlines() if line.startswith("Max processes")]
    assert nproc.split()[2:4] == ["64", "64"]
    log = runtime.log_path(8).read_text()
    assert "the workload's memory is not confined" in log
    assert "RLIMIT_NPROC=64 for uid 65534" in log


@as_root
def test_an_exec_check_runs_as_the_workloads_user(tmp_path, started):
    runtime = ProcessRuntime(tmp_path / "state")
    spec = confined_spec(9, security(user="nobody"), command=["sleep", "30"])
    running = started(runtime, spec)
    assert runtime.exec_check(running, spec, ["sh", "-c", 'test "$(id -u)" = 65534'], 5) == 0
