"""Simulated MPS control daemons that answer the control commands the agent sends.

What they reproduce (legacy MPS v2 interface, ``mpsv2-interface.html``; the environment
variables appendix; ``nvidia-cuda-mps-control(1)``):

* a daemon spawns its server when the first client connects (or on ``start_server -uid
  <uid>``), with the defaults set at that moment; ``set_default_*`` changes only servers spawned
  later; the server stays up after its clients leave until ``quit``;
* one server at a time, for one UID: a client of another UID waits while the running server has
  clients (:class:`MpsQueued`), and gets a new server of its own once they are gone;
* a server's limits (``set_active_thread_percentage <PID>``, ``set_device_pinned_mem_limit <PID>
  <dev> <value>``) reach the clients that connect afterwards;
* a client's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` "will
  only further constrain" its server's limits: :meth:`SimulatedMpsControl.client_limits` is what
  the client ends up with, whatever it exported;
* ``get_server_list`` and ``get_client_list <PID>`` list PIDs, one per line.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hostagent.mps import MpsDaemon, MpsError, MpsLimits, parse_memory_mib

_VALUE = re.compile(r"[1-9]\d*[MG]")
_CLIENT_VALUE = re.compile(r"(\d+(?:\.\d+)?)\s*([MG])B?", re.IGNORECASE)
NO_LIMIT = "0"
ROOT_UID = 0


class MpsQueued(MpsError):
    """The client's UID is not the running server's, which still has clients: legacy MPS
    queues the client until they are done (``nvidia-cuda-mps-control(1)``)."""


@dataclass
class _Server:
    pid: int
    uid: int
    percent: str
    pinned: str


@dataclass
class _Daemon:
    percent: str = "100.0"
    pinned: str = NO_LIMIT
    server: _Server | None = None
    commands: list[str] = field(default_factory=list)


def _percent(word: str) -> str:
    try:
        value = float(word)
    except ValueError:
        value = -1.0
    if not 0 < value <= 100:
        raise MpsError(f"Invalid active thread percentage {word!r}")
    return f"{value:.1f}"


def _client_percent(env: Mapping[str, str]) -> float | None:
    """A client's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (``None``: absent or not a
    percentage, which leaves the server's)."""
    try:
        value = float(env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", ""))
    except ValueError:
        return None
    return value if 0 < value <= 100 else None


def _client_memory_mib(env: Mapping[str, str], target: str) -> int | None:
    """A client's ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for its one device: ``<dev>=<limit>``
    entries, the device as an ordinal (``0``) or its UUID, ``1G`` / ``512M`` / ``512MB``."""
    for entry in env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "").split(","):
        device, _, value = entry.strip().partition("=")
        found = _CLIENT_VALUE.fullmatch(value.strip())
        if device.strip() in ("0", target) and found:
            size = float(found.group(1)) * (1024 if found.group(2).upper() == "G" else 1)
            return round(size) or None
    return None


class SimulatedMpsControl:
    """MPS daemons kept in memory; :meth:`SimulatedBackend.crash_mps` kills them.

    ``clients_of(target, server_pid)`` answers ``get_client_list``; the backend sets it, and
    shares its lock so a client starting and a command arriving never interleave.
    ``new_pid`` hands out server PIDs for ``start_server`` (the backend sets it too).
    """

    on_host = False

    def __init__(self, lock: threading.RLock | None = None) -> None:
        self._daemons: dict[str, _Daemon] = {}
        self._lock = lock or threading.RLock()
        self.clients_of: Callable[[str, int], tuple[int, ...]] = lambda _target, _server: ()
        self._pids = iter(range(900_000, 1_000_000))
        self.new_pid: Callable[[], int] = lambda: next(self._pids)

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
            return found.server.pid if found and found.server else None

    def connect(
        self, target_uuid: str, new_pid: Callable[[], int], uid: int = ROOT_UID
    ) -> int | None:
        """A client of ``uid`` starts on ``target_uuid``: return its server's PID, spawning the
        server with the daemon's current defaults; ``None`` when no daemon runs (the client
        runs without MPS, as the man page says).

        Raises:
            MpsQueued: a server of another UID runs with clients.
        """
        with self._lock:
            found = self._daemons.get(target_uuid)
            if found is None:
                return None
            return self._server_for(target_uuid, found, uid, new_pid).pid

    def _server_for(
        self, target: str, found: _Daemon, uid: int, new_pid: Callable[[], int]
    ) -> _Server:
        server = found.server
        if server is not None and server.uid == uid:
            return server
        if server is not None and self.clients_of(target, server.pid):
            raise MpsQueued(
                f"the MPS server of UID {server.uid} has clients: a client of UID {uid} waits "
                "until they are done"
            )
        found.server = _Server(new_pid(), uid, found.percent, found.pinned)
        return found.server

    def client_limits(self, target_uuid: str, env: Mapping[str, str]) -> MpsLimits | None:
        """What a client connecting now gets: its server's limits, lowered (never raised) by
        its ``CUDA_MPS_*`` environment; ``None`` when no server runs."""
        with self._lock:
            found = self._daemons.get(target_uuid)
            if found is None or found.server is None:
                return None
            percent = float(found.server.percent)
            wanted = _client_percent(env)
            if wanted is not None:
                percent = min(percent, wanted)
            memory = parse_memory_mib(found.server.pinned)
            asked = _client_memory_mib(env, target_uuid)
            if asked is not None:
                memory = asked if memory is None else min(memory, asked)
            return MpsLimits(round(percent), memory)

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
            if name == "start_server":
                return self._start_server(daemon.target_uuid, found, args)
            if name.startswith("set_"):
                self._set(daemon.target_uuid, found, name, args)
                return ""
            return self._get(daemon.target_uuid, found, name, args)

    def _start_server(self, target: str, found: _Daemon, args: list[str]) -> str:
        """``start_server -uid <uid>``: a server for ``uid`` with the current defaults."""
        if len(args) != 2 or args[0] != "-uid" or not args[1].isdecimal():
            raise MpsError(f"Invalid arguments to start_server: {' '.join(args)!r}")
        self._server_for(target, found, int(args[1]), self.new_pid)
        return ""

    def _device(self, target: str, word: str) -> None:
        if word not in ("0", target):
            raise MpsError(f"Invalid device {word!r}")

    def _server(self, found: _Daemon, word: str) -> _Server:
        if found.server is None or word != str(found.server.pid):
            raise MpsError(f"No server with PID {word}")
        return found.server

    def _set(self, target: str, found: _Daemon, name: str, args: list[str]) -> None:
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            found.percent = _percent(args[0])
        elif name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            self._device(target, args[0])
            found.pinned = self._value(args[1])
        elif name == "set_active_thread_percentage" and len(args) == 2:
            self._server(found, args[0]).percent = _percent(args[1])
        elif name == "set_device_pinned_mem_limit" and len(args) == 3:
            server = self._server(found, args[0])
            self._device(target, args[1])
            server.pinned = self._value(args[2])
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
            return "" if found.server is None else str(found.server.pid)
        if name == "get_client_list" and len(args) == 1:
            self._server(found, args[0])
            return "\n".join(str(pid) for pid in self.clients_of(target, int(args[0])))
        if name == "get_active_thread_percentage" and len(args) == 1:
            return self._server(found, args[0]).percent
        if name == "get_device_pinned_mem_limit" and len(args) == 2:
            server = self._server(found, args[0])
            self._device(target, args[1])
            return server.pinned
        raise MpsError(f"Unknown command {name} {' '.join(args)}")
