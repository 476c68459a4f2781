"""The process workloads' cgroups, on a temporary directory standing in for /sys/fs/cgroup."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostagent.runtime.cgroups import Cgroups, own_cgroup

AGENT_PID = 4242


def fake_cgroup(
    root: Path, path: str, *, controllers="cpu memory pids", procs="", enabled=""
) -> Path:
    directory = root / path.strip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup.controllers").write_text(controllers + "\n")
    (directory / "cgroup.subtree_control").write_text(enabled + "\n")
    (directory / "cgroup.procs").write_text(procs)
    return directory


def test_the_agents_own_cgroup_is_the_v2_line_of_proc_self_cgroup():
    assert own_cgroup("0::/system.slice/fleet-agent.service\n") == (
        "/system.slice/fleet-agent.service"
    )
    hybrid = "12:memory:/x\n1:name=systemd:/y\n0::/user.slice/session-1.scope\n"
    assert own_cgroup(hybrid) == "/user.slice/session-1.scope"
    assert own_cgroup("4:memory:/docker/abc\n1:cpu:/\n") is None  # cgroup v1 only


def test_an_agent_in_its_base_moves_to_a_leaf_and_delegates_memory_and_pids(tmp_path):
    base = fake_cgroup(tmp_path, "/system.slice/fleet.service", procs=f"{AGENT_PID}\n")
    cgroups = Cgroups(tmp_path, "/system.slice/fleet.service", pid=AGENT_PID)
    assert cgroups.available and cgroups.problem is None
    assert (base / "agent" / "cgroup.procs").read_text() == str(AGENT_PID)
    assert (base / "cgroup.subtree_control").read_text() == "+memory +pids"


def test_a_base_that_already_delegates_is_left_as_it_is(tmp_path):
    base = fake_cgroup(tmp_path, "/fleet", enabled="memory pids", procs=f"{AGENT_PID}\n")
    assert Cgroups(tmp_path, "/fleet", pid=AGENT_PID).available
    assert not (base / "agent").exists()


def test_a_replicas_cgroup_carries_its_memory_and_pid_limits(tmp_path):
    base = fake_cgroup(tmp_path, "/fleet")
    cgroups = Cgroups(tmp_path, "/fleet", pid=AGENT_PID)
    (base / "fleet-7").mkdir()
    (base / "fleet-7" / "memory.swap.max").write_text("max\n")
    path = cgroups.create(7, memory_mib=1024, pids_limit=256)
    assert path == base / "fleet-7"
    assert (path / "memory.max").read_text() == str(1024 * 2**20)
    assert (path / "pids.max").read_text() == "256"
    assert (path / "memory.swap.max").read_text() == "0"
    unlimited = cgroups.create(8, memory_mib=None, pids_limit=4096)
    assert (unlimited / "memory.max").read_text() == "max"
    assert not (unlimited / "memory.swap.max").exists()


def test_a_replicas_cgroup_is_removed_once_empty_and_kept_while_it_holds_processes(tmp_path):
    fake_cgroup(tmp_path, "/fleet")
    cgroups = Cgroups(tmp_path, "/fleet", pid=AGENT_PID)
    path = cgroups.create(7, memory_mib=64, pids_limit=16)
    (path / "cgroup.procs").write_text("123\n")
    cgroups.remove(7)
    assert path.exists()
    (path / "cgroup.procs").write_text("")
    cgroups.remove(7)
    assert not path.exists()
    cgroups.remove(7)  # already gone: nothing to do


@pytest.mark.parametrize(
    ("controllers", "problem"),
    [
        ("cpu io", "cannot use the memory and pids controller"),
        ("cpu memory", "cannot use the pids controller"),
    ],
)
def test_a_base_without_the_controllers_is_not_used_and_says_why(tmp_path, controllers, problem):
    fake_cgroup(tmp_path, "/fleet", controllers=controllers)
    cgroups = Cgroups(tmp_path, "/fleet", pid=AGENT_PID)
    assert not cgroups.available
    assert problem in (cgroups.problem or "")


def test_a_base_that_does_not_exist_is_not_used_and_says_why(tmp_path):
    cgroups = Cgroups(tmp_path, "/nowhere", pid=AGENT_PID)
    assert not cgroups.available
    assert "cannot delegate the memory and pids controllers" in (cgroups.problem or "")
