"""Simulated MPS control daemons that answer the control commands the agent sends.

What they reproduce (MPS v2 interface, ``nvidia-cuda-mps-control(1)``): a daemon spawns its
server when the first client connects, with the defaults set at that moment; ``set_default_*``
changes only servers spawned later; the server stays up after its clients leave until ``quit``;
``get_server_list`` and ``get_client_list <PID>`` list PIDs, one per line.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hostagent.mps import MpsDaemon, MpsError

_VALUE = re.compile(r"[1-9]\d*[MG]")
NO_LIMIT = "0"


@dataclass
class _Daemon:
    percent: str = "100.0"
    pinned: str = NO_LIMIT
    server_pid: int | None = None
    server_percent: str = "100.0"
    server_pinned: str = NO_LIMIT
    commands: list[str] = field(default_factory=list)


def _percent(word: str) -> str:
    try:
        value = float(word)
    except ValueError:
        value = -1.0
    if not 0 < value <= 100:
        raise MpsError(f"Invalid active thread percentage {word!r}")
    return f"{value:.1f}"


class SimulatedMpsControl:
    """MPS daemons kept in memory; :meth:`SimulatedBackend.crash_mps` kills them.

    ``clients_of(target, server_pid)`` answers ``get_client_list``; the backend sets it, and
    shares its lock so a client starting and a command arriving never interleave.
    """

    on_host = False

    def __init__(self, lock: threading.RLock | None = None) -> None:
        self._daemons: dict[str, _Daemon] = {}
        self._lock = lock or threading.RLock()
        self.clients_of: Callable[[str, int], tuple[int, ...]] = lambda _target, _server: ()

    def start(self, daemon: MpsDaemon) -> None:
        """Mark the daemon for ``daemon.target_uuid`` as running (fresh defaults, no server)."""
        with self._lock:
            self._daemons.setdefault(daemon.target_uuid, _Daemon())

    def stop(self, daemon: MpsDaemon) -> None:
        """``quit``: the daemon and its server end."""
        with self._lock:
            self._daemons.pop(daemon.target_uuid, None)

    def is_running(self, daemon: MpsDaemon) -> bool:
        """True if started and not crashed."""
        with self._lock:
            return daemon.target_uuid in self._daemons

    def running_targets(self, base_dir: Path) -> list[str]:
        """Every running daemon (they live in this process, whatever the base directory)."""
        with self._lock:
            return sorted(self._daemons)

    def crash(self, target_uuids: list[str]) -> None:
        """Kill the daemons of these targets (fault injection)."""
        with self._lock:
            for target in target_uuids:
                self._daemons.pop(target, None)

    def server_pid(self, target_uuid: str) -> int | None:
        """The PID of the target's ``nvidia-cuda-mps-server``, if one runs."""
        with self._lock:
            found = self._daemons.get(target_uuid)
            return found.server_pid if found else None

    def connect(self, target_uuid: str, new_pid: Callable[[], int]) -> int | None:
        """A client starts on ``target_uuid``: return its server's PID, spawning the server with
        the daemon's current defaults; ``None`` when no daemon runs (the client runs without
        MPS, as the man page says)."""
        with self._lock:
            found = self._daemons.get(target_uuid)
            if found is None:
                return None
            if found.server_pid is None:
                found.server_pid = new_pid()
                found.server_percent, found.server_pinned = found.percent, found.pinned
            return found.server_pid

    def commands(self, target_uuid: str) -> list[str]:
        """The commands the daemon received (for tests)."""
        with self._lock:
            found = self._daemons.get(target_uuid)
            return list(found.commands) if found else []

    def command(self, daemon: MpsDaemon, line: str) -> str:
        """Answer a control command like ``nvidia-cuda-mps-control`` does."""
        with self._lock:
            found = self._daemons.get(daemon.target_uuid)
            if found is None:
                raise MpsError(f"no MPS daemon for {daemon.target_uuid}")
            found.commands.append(line)
            name, *args = line.split()
            if name.startswith("set_"):
                self._set(daemon.target_uuid, found, name, args)
                return ""
            return self._get(daemon.target_uuid, found, name, args)

    def _device(self, target: str, word: str) -> None:
        if word not in ("0", target):
            raise MpsError(f"Invalid device {word!r}")

    def _server(self, found: _Daemon, word: str) -> None:
        if found.server_pid is None or word != str(found.server_pid):
            raise MpsError(f"No server with PID {word}")

    def _set(self, target: str, found: _Daemon, name: str, args: list[str]) -> None:
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            found.percent = _percent(args[0])
        elif name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            self._device(target, args[0])
            found.pinned = self._value(args[1])
        elif name == "set_active_thread_percentage" and len(args) == 2:
            self._server(found, args[0])
            found.server_percent = _percent(args[1])
        elif name == "set_device_pinned_mem_limit" and len(args) == 3:
            self._server(found, args[0])
            self._device(target, args[1])
            found.server_pinned = self._value(args[2])
        else:
            raise MpsError(f"Unknown command {name} {' '.join(args)}")

    @staticmethod
    def _value(word: str) -> str:
        if not _VALUE.fullmatch(word):
            raise MpsError(f"Invalid memory limit {word!r}")
        return word

    def _get(self, target: str, found: _Daemon, name: str, args: list[str]) -> str:
        if name == "get_default_active_thread_percentage" and not args:
            return found.percent
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            self._device(target, args[0])
            return found.pinned
        if name == "get_server_list" and not args:
            return "" if found.server_pid is None else str(found.server_pid)
        if name == "get_client_list" and len(args) == 1:
            self._server(found, args[0])
            return "\n".join(str(pid) for pid in self.clients_of(target, int(args[0])))
        if name == "get_active_thread_percentage" and len(args) == 1:
            self._server(found, args[0])
            return found.server_percent
        if name == "get_device_pinned_mem_limit" and len(args) == 2:
            self._server(found, args[0])
            self._device(target, args[1])
            return found.server_pinned
        raise MpsError(f"Unknown command {name} {' '.join(args)}")
