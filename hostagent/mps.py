"""MPS control daemons: one per GPU or per MIG instance, each with its own pipe and log directory.

The daemon is ``nvidia-cuda-mps-control -d`` started with ``CUDA_VISIBLE_DEVICES=<GPU or MIG
UUID>``, ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` under
``<base>/<uuid>/pipe|log`` (``/tmp/fleet-mps`` by default). Limits are set by writing control
commands to the daemon's stdin interface (``set_default_active_thread_percentage``,
``set_default_device_pinned_mem_limit``); health is "``get_default_active_thread_percentage``
answers", as the k8s device plugin checks it. Clients get the environment from
:func:`client_env` (``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``,
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), the way ECS sets them per task.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hostagent.protocol import MpsDaemonInfo

logger = logging.getLogger(__name__)

DEFAULT_BASE_DIR = Path("/tmp/fleet-mps")
MPS_CONTROL_BINARY = "nvidia-cuda-mps-control"


class MpsError(Exception):
    """The daemon did not start, did not answer, or refused a command."""


@dataclass(frozen=True)
class MpsDaemon:
    """Where one daemon lives: its target (GPU or MIG UUID) and its directories."""

    target_uuid: str
    pipe_directory: Path
    log_directory: Path

    @classmethod
    def for_target(cls, base_dir: Path, target_uuid: str) -> MpsDaemon:
        """The daemon layout ``<base>/<uuid>/pipe`` and ``<base>/<uuid>/log``."""
        root = base_dir / target_uuid
        return cls(target_uuid, root / "pipe", root / "log")

    def environment(self) -> dict[str, str]:
        """The daemon's environment additions."""
        return {
            "CUDA_VISIBLE_DEVICES": self.target_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_directory),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_directory),
        }


class MpsControl(Protocol):
    """Starts, stops and talks to MPS control daemons (real or simulated)."""

    def start(self, daemon: MpsDaemon) -> None:
        """Start the daemon (``nvidia-cuda-mps-control -d``); no-op if it runs."""

    def stop(self, daemon: MpsDaemon) -> None:
        """Stop the daemon (``echo quit | nvidia-cuda-mps-control``)."""

    def is_running(self, daemon: MpsDaemon) -> bool:
        """True if the daemon process exists."""

    def command(self, daemon: MpsDaemon, line: str) -> str:
        """Send one control command and return its answer; raise :class:`MpsError`."""


class SubprocessMpsControl:
    """Drives the real ``nvidia-cuda-mps-control`` binary."""

    def __init__(self, binary: str = MPS_CONTROL_BINARY, timeout_s: float = 5.0) -> None:
        self._binary = binary
        self._timeout_s = timeout_s

    def _run(self, daemon: MpsDaemon, args: list[str], stdin: str | None) -> str:
        env = {**os.environ, **daemon.environment()}
        try:
            done = subprocess.run(
                [self._binary, *args],
                input=stdin,
                env=env,
                capture_output=True,
                text=True,
                timeout=self._timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"{self._binary} {' '.join(args)}: {exc}") from exc
        if done.returncode != 0:
            raise MpsError(f"{self._binary} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout.strip()

    def start(self, daemon: MpsDaemon) -> None:
        """``nvidia-cuda-mps-control -d`` with the daemon's directories created (0700)."""
        if self.is_running(daemon):
            return
        daemon.pipe_directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        daemon.log_directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._run(daemon, ["-d"], None)

    def stop(self, daemon: MpsDaemon) -> None:
        """``echo quit | nvidia-cuda-mps-control``."""
        if self.is_running(daemon):
            self._run(daemon, [], "quit\n")

    def is_running(self, daemon: MpsDaemon) -> bool:
        """The daemon writes ``nvidia-cuda-mps-control.pid`` into its pipe directory."""
        pid_file = daemon.pipe_directory / "nvidia-cuda-mps-control.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def command(self, daemon: MpsDaemon, line: str) -> str:
        """Write ``line`` to the control interface (stdin) and return stdout."""
        return self._run(daemon, [], line + "\n")


@dataclass(frozen=True)
class MpsLimits:
    """Daemon-wide defaults; ``None`` leaves the MPS default (100 %, no memory limit)."""

    active_thread_percentage: int | None = None
    pinned_mem_limit_mib: int | None = None


class MpsManager:
    """Keeps the agent's MPS daemons and their limits; remembers what it set."""

    def __init__(self, control: MpsControl, base_dir: Path = DEFAULT_BASE_DIR) -> None:
        self.control = control
        self.base_dir = base_dir
        self._limits: dict[str, MpsLimits] = {}

    def daemon(self, target_uuid: str) -> MpsDaemon:
        """The directory layout for ``target_uuid``."""
        return MpsDaemon.for_target(self.base_dir, target_uuid)

    def managed_targets(self) -> list[str]:
        """Targets this manager started and has not stopped."""
        return sorted(self._limits)

    def ensure(self, target_uuid: str, limits: MpsLimits) -> None:
        """Start the daemon if needed and apply ``limits``; raise :class:`MpsError`."""
        daemon = self.daemon(target_uuid)
        self.control.start(daemon)
        if limits.active_thread_percentage is not None:
            self.control.command(
                daemon, f"set_default_active_thread_percentage {limits.active_thread_percentage}"
            )
        if limits.pinned_mem_limit_mib is not None:
            self.control.command(
                daemon,
                f"set_default_device_pinned_mem_limit {target_uuid} {limits.pinned_mem_limit_mib}M",
            )
        self._limits[target_uuid] = limits
        logger.info("MPS daemon for %s ready with %s", target_uuid, limits)

    def stop(self, target_uuid: str) -> None:
        """Stop the daemon for ``target_uuid``."""
        self.control.stop(self.daemon(target_uuid))
        self._limits.pop(target_uuid, None)

    def limits(self, target_uuid: str) -> MpsLimits | None:
        """The limits last applied, or ``None`` if not managed."""
        return self._limits.get(target_uuid)

    def healthy(self, target_uuid: str) -> bool:
        """True if ``get_default_active_thread_percentage`` answers (k8s device plugin check)."""
        daemon = self.daemon(target_uuid)
        try:
            if not self.control.is_running(daemon):
                return False
            self.control.command(daemon, "get_default_active_thread_percentage")
        except MpsError:
            return False
        return True

    def info(self, target_uuid: str) -> MpsDaemonInfo:
        """The wire view of one daemon."""
        daemon = self.daemon(target_uuid)
        running = self.control.is_running(daemon)
        limits = self._limits.get(target_uuid)
        return {
            "target_uuid": target_uuid,
            "running": running,
            "healthy": running and self.healthy(target_uuid),
            "pipe_directory": str(daemon.pipe_directory) if running or limits else None,
            "default_active_thread_percentage": limits.active_thread_percentage if limits else None,
            "default_pinned_mem_limit_mib": limits.pinned_mem_limit_mib if limits else None,
        }


def client_env(
    daemon: MpsDaemon, memory_mib: int | None, max_compute_percent: int | None
) -> dict[str, str]:
    """Environment for one MPS client (an allocation), ECS style.

    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` uses the ``<uuid>=<N>M`` form so it does not depend on
    device ordinals inside the container.
    """
    env = {
        "CUDA_VISIBLE_DEVICES": daemon.target_uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_directory),
    }
    if memory_mib is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{daemon.target_uuid}={memory_mib}M"
    if max_compute_percent is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max_compute_percent)
    return env
