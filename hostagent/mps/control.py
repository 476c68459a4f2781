"""The ``nvidia-cuda-mps-control`` interface: the seam, the real binary, and parsers for what the
control daemon answers (MPS v2 interface, ``mpsv2-interface.html``)."""

from __future__ import annotations

import logging
import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Protocol

from hostagent.mps.layout import PID_FILE, MpsDaemon, MpsError

logger = logging.getLogger(__name__)

MPS_CONTROL_BINARY = "nvidia-cuda-mps-control"

_ERROR_MARKERS = ("error", "invalid", "unknown", "fail", "not found", "cannot", "unable", "usage")
_PERCENT = re.compile(r"\d+(?:\.\d+)?")
_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*([MG])(?:i?B)?\b", re.IGNORECASE)


class MpsControl(Protocol):
    """Starts, stops and talks to MPS control daemons (real or simulated).

    ``on_host`` is true when the daemons are processes on this host that outlive the agent: the
    manager then secures their directories and keeps its state file.
    """

    on_host: bool

    def start(self, daemon: MpsDaemon) -> None:
        """Start the daemon (``nvidia-cuda-mps-control -d``); no-op if it runs."""

    def stop(self, daemon: MpsDaemon) -> None:
        """Stop the daemon (``echo quit | nvidia-cuda-mps-control``)."""

    def is_running(self, daemon: MpsDaemon) -> bool:
        """True if the daemon process exists."""

    def command(self, daemon: MpsDaemon, line: str) -> str:
        """Send one control command and return its answer; raise :class:`MpsError`."""

    def running_targets(self, base_dir: Path) -> list[str]:
        """Targets whose daemon runs under ``base_dir`` (``<base>/*/pipe/<pid file>``)."""


def check_answer(line: str, answer: str) -> str:
    """Raise :class:`MpsError` if the control daemon's answer to ``line`` reports an error.

    ``nvidia-cuda-mps-control`` answers on stdout; whether it exits non-zero on a refused command
    is not documented (review D16), so the text is checked too. ``set_*`` commands answer nothing.
    """
    lowered = answer.lower()
    if any(marker in lowered for marker in _ERROR_MARKERS):
        raise MpsError(f"{line!r} refused: {answer.strip()[:200]}")
    return answer


class SubprocessMpsControl:
    """Drives the real ``nvidia-cuda-mps-control`` binary."""

    on_host = True

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
            why = (done.stderr or done.stdout).strip()
            raise MpsError(f"{self._binary} exited {done.returncode}: {why}")
        return done.stdout.strip()

    def start(self, daemon: MpsDaemon) -> None:
        """``nvidia-cuda-mps-control -d``; the directories are prepared by :class:`MpsManager`."""
        if self.is_running(daemon):
            return
        self._run(daemon, ["-d"], None)

    def stop(self, daemon: MpsDaemon) -> None:
        """``echo quit | nvidia-cuda-mps-control``."""
        if self.is_running(daemon):
            self._run(daemon, [], "quit\n")

    def is_running(self, daemon: MpsDaemon) -> bool:
        """The daemon writes ``nvidia-cuda-mps-control.pid`` into its pipe directory."""
        pid_file = daemon.pipe_directory / PID_FILE
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
        """Write ``line`` to the control interface (stdin); return stdout, checked for errors."""
        return check_answer(line, self._run(daemon, [], line + "\n"))

    def running_targets(self, base_dir: Path) -> list[str]:
        """Scan ``<base>/*/pipe/nvidia-cuda-mps-control.pid`` (the MPS appendix's pid file)."""
        try:
            info = os.lstat(base_dir)
        except FileNotFoundError:
            return []
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            logger.warning("not adopting MPS daemons from %s: not the agent's directory", base_dir)
            return []
        found = []
        for pid_file in sorted(base_dir.glob(f"*/pipe/{PID_FILE}")):
            target = pid_file.parent.parent.name
            if self.is_running(MpsDaemon.for_target(base_dir, target)):
                found.append(target)
        return found


def parse_percentage(answer: str) -> int:
    """``get_default_active_thread_percentage`` prints e.g. ``25.0``."""
    found = _PERCENT.search(answer)
    if found is None:
        raise MpsError(f"unexpected active thread percentage {answer!r}")
    return round(float(found.group()))


def parse_memory_mib(answer: str) -> int | None:
    """``get_default_device_pinned_mem_limit`` prints e.g. ``3G`` or ``1024M``; anything without
    a size (``0``, empty) means no limit."""
    found = _MEMORY.search(answer)
    if found is None:
        return None
    value = float(found.group(1)) * (1024 if found.group(2).upper() == "G" else 1)
    return round(value) or None


def parse_pids(answer: str) -> tuple[int, ...]:
    """``get_server_list`` / ``get_client_list <PID>`` print one PID per line."""
    pids = []
    for word in answer.split():
        if not word.isdecimal():
            raise MpsError(f"unexpected PID list {answer[:200]!r}")
        pids.append(int(word))
    return tuple(sorted(set(pids)))
