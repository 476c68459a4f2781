"""MPS daemons on a host: directories non-root clients can reach (D4), limits that are applied or
reported as not (D9), daemons that outlive the agent (D10), no ``quit`` under clients (D15), and
checked commands (D16). The control daemon is a fake; the directories are real."""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hostagent import mps as mps_module
from hostagent.mps import (
    DEFAULT_BASE_DIR,
    MpsBusy,
    MpsDaemon,
    MpsError,
    MpsLimits,
    MpsManager,
    SubprocessMpsControl,
    UnsafeDirectory,
    client_env,
)

GPU = "GPU-2b5d1c30-0c4e-4b7b-9a57-6b1f0b0f0001"
MIG = "MIG-8f3e7d55-1d7a-5b43-8f9a-0f5ad1e0c002"


@dataclass
class FakeDaemon:
    percent: str = "100.0"
    pinned: str = "0"
    server: int | None = None
    server_percent: str = "100.0"
    server_pinned: str = "0"
    clients: list[int] = field(default_factory=list)


class FakeControl:
    """An ``nvidia-cuda-mps-control`` that keeps its daemons across agent restarts (a new
    manager over the same fake) and records every command."""

    on_host = True

    def __init__(self) -> None:
        self.daemons: dict[str, FakeDaemon] = {}
        self.log: list[str] = []
        self.answers: dict[str, str] = {}

    def start(self, daemon: MpsDaemon) -> None:
        assert daemon.pipe_directory.is_dir() and daemon.log_directory.is_dir()
        if daemon.target_uuid not in self.daemons:
            self.log.append(f"start {daemon.target_uuid}")
            self.daemons[daemon.target_uuid] = FakeDaemon()

    def stop(self, daemon: MpsDaemon) -> None:
        self.log.append(f"quit {daemon.target_uuid}")
        self.daemons.pop(daemon.target_uuid, None)

    def is_running(self, daemon: MpsDaemon) -> bool:
        return daemon.target_uuid in self.daemons

    def running_targets(self, base_dir: Path) -> list[str]:
        return sorted(self.daemons)

    def connect(self, target: str, client: int, server: int = 900) -> None:
        """A client connects (spawning the server with the current defaults)."""
        d = self.daemons[target]
        if d.server is None:
            d.server, d.server_percent, d.server_pinned = server, d.percent, d.pinned
        d.clients.append(client)

    def command(self, daemon: MpsDaemon, line: str) -> str:
        self.log.append(line)
        d = self.daemons[daemon.target_uuid]
        name, *args = line.split()
        if name in self.answers:
            return self.answers[name]
        setters = {
            "set_default_active_thread_percentage": lambda: setattr(d, "percent", args[0]),
            "set_default_device_pinned_mem_limit": lambda: setattr(d, "pinned", args[1]),
            "set_active_thread_percentage": lambda: setattr(d, "server_percent", args[1]),
            "set_device_pinned_mem_limit": lambda: setattr(d, "server_pinned", args[2]),
        }
        if name in setters:
            setters[name]()
            return ""
        return {
            "get_default_active_thread_percentage": f"{float(d.percent):.1f}",
            "get_default_device_pinned_mem_limit": d.pinned,
            "get_server_list": "" if d.server is None else str(d.server),
            "get_client_list": "\n".join(map(str, d.clients)),
            "get_active_thread_percentage": f"{float(d.server_percent):.1f}",
            "get_device_pinned_mem_limit": d.server_pinned,
        }[name]


@pytest.fixture
def control() -> FakeControl:
    return FakeControl()


@pytest.fixture
def manager(control: FakeControl, tmp_path: Path) -> MpsManager:
    return MpsManager(control, tmp_path / "run" / "fleet-mps")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- D4: directories ------------------------------------------------------------------------------


def test_the_default_base_directory_is_the_agents_run_directory_not_world_writable_tmp():
    assert str(DEFAULT_BASE_DIR) == "/run/fleet-mps"


def test_every_mps_directory_is_created_0755_whatever_the_umask(manager, control):
    old = os.umask(0o077)
    try:
        manager.ensure(GPU, MpsLimits(50))
    finally:
        os.umask(old)
    daemon = manager.daemon(GPU)
    for path in (manager.base_dir, daemon.root, daemon.pipe_directory, daemon.log_directory):
        assert mode(path) == 0o755, path
    assert control.daemons[GPU].percent == "50"


def test_directories_left_0700_by_an_older_agent_are_opened_to_0755(manager):
    daemon = manager.daemon(GPU)
    daemon.pipe_directory.mkdir(parents=True, mode=0o700)
    daemon.pipe_directory.chmod(0o700)
    manager.ensure(GPU, MpsLimits())
    assert mode(daemon.pipe_directory) == 0o755
    assert mode(daemon.root) == 0o755


def test_a_symlink_in_place_of_a_daemon_directory_is_refused(manager, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    elsewhere.chmod(0o777)
    manager.base_dir.mkdir(parents=True)
    (manager.base_dir / GPU).symlink_to(elsewhere)
    with pytest.raises(UnsafeDirectory, match="symlink"):
        manager.ensure(GPU, MpsLimits())
    assert mode(elsewhere) == 0o777  # the target was not touched
    assert not (elsewhere / "pipe").exists()


def test_a_symlinked_base_directory_is_refused(control, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UnsafeDirectory):
        MpsManager(control, tmp_path / "link").ensure(GPU, MpsLimits())


def test_a_directory_owned_by_another_user_is_refused(manager, monkeypatch):
    manager.base_dir.mkdir(parents=True)
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
    with pytest.raises(UnsafeDirectory, match="owned by UID"):
        manager.ensure(GPU, MpsLimits())


def test_the_mps_dir_setting_reaches_the_manager(tmp_path):
    from hostagent.config import AgentConfig
    from hostagent.daemon import build_backend

    spec = tmp_path / "gpus.json"
    spec.write_text(
        '[{"name": "NVIDIA L4", "pci_device_id": 666505438, "memory_mib": 23034, '
        '"mig_capable": false, "compute_slice_count": 0, "memory_slice_count": 0, '
        '"profiles": []}]'
    )
    _, mps = build_backend(AgentConfig(simulate=spec, mps_dir=tmp_path / "mps"))
    assert mps.base_dir == tmp_path / "mps"


# -- D9: limits applied, or said not to be --------------------------------------------------------


def test_both_limits_are_always_sent_and_a_removed_thread_limit_as_100(manager, control):
    manager.ensure(GPU, MpsLimits(50, 1024))
    assert "set_default_active_thread_percentage 50" in control.log
    assert "set_default_device_pinned_mem_limit 0 1024M" in control.log
    control.log.clear()
    manager.ensure(GPU, MpsLimits(None, 1024))
    assert "set_default_active_thread_percentage 100" in control.log
    assert manager.info(GPU)["default_active_thread_percentage"] == 100


def test_a_removed_memory_limit_restarts_an_idle_daemon(manager, control):
    manager.ensure(GPU, MpsLimits(50, 1024))
    control.log.clear()
    manager.ensure(GPU, MpsLimits(50, None))
    assert f"quit {GPU}" in control.log
    assert manager.limits(GPU) == MpsLimits(50, None)
    assert manager.info(GPU)["default_pinned_mem_limit_mib"] is None


def test_a_server_without_clients_is_restarted_to_take_new_limits(manager, control):
    manager.ensure(GPU, MpsLimits(50))
    control.connect(GPU, client=4242)
    control.daemons[GPU].clients.clear()  # the client left; the server stays up
    manager.ensure(GPU, MpsLimits(25))
    assert f"quit {GPU}" in control.log
    assert control.daemons[GPU].server is None  # the next client gets a server with 25 %
    assert control.daemons[GPU].percent == "25"


def test_a_server_with_clients_gets_the_per_server_commands_and_the_note_says_so(manager, control):
    manager.ensure(GPU, MpsLimits(50, 2048))
    control.connect(GPU, client=4242, server=901)
    note = manager.ensure(GPU, MpsLimits(25, 1024))
    assert "set_active_thread_percentage 901 25" in control.log
    assert "set_device_pinned_mem_limit 901 0 1024M" in control.log
    assert f"quit {GPU}" not in control.log
    assert "1 connected client" in note
    assert manager.limits(GPU) == MpsLimits(25, 1024)


def test_a_server_raised_behind_the_agents_back_is_set_back_though_the_defaults_hold(
    manager, control
):
    manager.ensure(GPU, MpsLimits(25, 1024))
    control.connect(GPU, client=4242, server=901)
    control.daemons[GPU].server_percent = "100"  # set_active_thread_percentage 901 100
    control.log.clear()
    manager.ensure(GPU, MpsLimits(25, 1024))
    assert "set_active_thread_percentage 901 25" in control.log
    assert control.daemons[GPU].server_percent == "25"


def test_a_server_that_does_not_take_its_limits_is_an_error(manager, control):
    manager.ensure(GPU, MpsLimits(50, 2048))
    control.connect(GPU, client=4242, server=901)
    control.answers["get_active_thread_percentage"] = "50.0"  # ignores the set
    with pytest.raises(MpsError, match="server 901 reads back"):
        manager.ensure(GPU, MpsLimits(25, 2048))


def test_a_memory_limit_cannot_be_cleared_under_connected_clients(manager, control):
    manager.ensure(GPU, MpsLimits(50, 2048))
    control.connect(GPU, client=4242)
    with pytest.raises(MpsBusy) as exc:
        manager.ensure(GPU, MpsLimits(50, None))
    assert exc.value.pids == (4242,)
    assert f"quit {GPU}" not in control.log
    # The agent reports what the daemon has, not what it was asked for.
    assert manager.info(GPU)["default_pinned_mem_limit_mib"] == 2048


def test_limits_are_reported_as_read_back_and_a_mismatch_is_an_error(manager, control):
    control.answers["get_default_active_thread_percentage"] = "30.0"
    with pytest.raises(MpsError, match="reads back"):
        manager.ensure(GPU, MpsLimits(50))
    assert manager.info(GPU)["default_active_thread_percentage"] == 30


# -- D16: checked commands, device ordinal 0 ------------------------------------------------------


def test_a_single_target_daemon_is_addressed_as_device_0(manager, control):
    manager.ensure(MIG, MpsLimits(40, 512))
    assert "set_default_device_pinned_mem_limit 0 512M" in control.log
    assert "get_default_device_pinned_mem_limit 0" in control.log
    assert not any(MIG in line for line in control.log if line.startswith(("set_", "get_")))


def test_the_client_environment_names_its_one_device_by_ordinal_0(tmp_path):
    env = client_env(MpsDaemon.for_target(tmp_path, MIG), 1024, 25)
    assert env["CUDA_VISIBLE_DEVICES"] == MIG
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


@pytest.fixture
def fake_binary(tmp_path: Path) -> Path:
    """An ``nvidia-cuda-mps-control`` that exits 0 but refuses ``set_`` commands in words."""
    script = tmp_path / "nvidia-cuda-mps-control"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "line = sys.stdin.read().strip()\n"
        "if line.startswith('set_'):\n"
        "    print('Error: invalid device 0')\n"
        "elif line == 'get_default_active_thread_percentage':\n"
        "    print('25.0')\n"
    )
    script.chmod(0o755)
    return script


def test_a_command_refused_in_words_is_an_error_even_with_exit_status_0(fake_binary, tmp_path):
    control = SubprocessMpsControl(binary=str(fake_binary))
    daemon = MpsDaemon.for_target(tmp_path, GPU)
    assert control.command(daemon, "get_default_active_thread_percentage") == "25.0"
    with pytest.raises(MpsError, match="invalid device"):
        control.command(daemon, "set_default_device_pinned_mem_limit 0 1024M")


# -- D10: daemons outlive the agent ---------------------------------------------------------------


def test_daemons_outlive_an_agent_restart_and_are_adopted_with_their_limits(control, tmp_path):
    base = tmp_path / "mps"
    MpsManager(control, base).ensure(GPU, MpsLimits(50, 1024))
    state = base / mps_module.STATE_FILE
    assert mode(state) == 0o600
    assert not list(base.glob(".state-*"))  # written aside, then renamed
    restarted = MpsManager(control, base)
    assert restarted.managed_targets() == [GPU]
    assert restarted.limits(GPU) == MpsLimits(50, 1024)
    restarted.stop(GPU)
    assert GPU not in control.daemons
    assert MpsManager(control, base).managed_targets() == []


def test_the_subprocess_control_finds_running_daemons_by_their_pid_files(tmp_path):
    base = tmp_path / "mps"
    for target, pid in ((GPU, os.getpid()), (MIG, 2**22 + 12345)):  # alive, and gone
        pipe = base / target / "pipe"
        pipe.mkdir(parents=True)
        (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{pid}\n")
    assert SubprocessMpsControl().running_targets(base) == [GPU]
    assert SubprocessMpsControl().running_targets(tmp_path / "absent") == []


# -- D15: no quit under clients -------------------------------------------------------------------


def test_a_daemon_with_clients_is_not_quit(manager, control):
    manager.ensure(GPU, MpsLimits(50))
    control.connect(GPU, client=4242)
    with pytest.raises(MpsBusy) as exc:
        manager.stop(GPU)
    assert exc.value.pids == (4242,)
    assert GPU in control.daemons and manager.managed_targets() == [GPU]
    control.daemons[GPU].clients.clear()
    manager.stop(GPU)
    assert GPU not in control.daemons and manager.managed_targets() == []
