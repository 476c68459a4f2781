"""The agent's MPS daemons: started with their limits, read back, persisted, adopted, stopped only
when no client is connected (review D9, D10, D15, D16)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostagent.mps.control import MpsControl, parse_memory_mib, parse_percentage, parse_pids
from hostagent.mps.layout import (
    DEFAULT_BASE_DIR,
    SINGLE_TARGET_DEVICE,
    MpsBusy,
    MpsDaemon,
    MpsError,
    prepare_directories,
)
from hostagent.mps.limits import MpsLimits
from hostagent.protocol import MpsDaemonInfo, workload_environment

logger = logging.getLogger(__name__)

STATE_FILE = "fleet-mps-state.json"
STATE_MODE = 0o600


@dataclass(frozen=True)
class MpsStatus:
    """A running daemon as observed: limits read back, server PIDs and their client PIDs."""

    limits: MpsLimits
    server_pids: tuple[int, ...]
    client_pids: tuple[int, ...]


class MpsManager:
    """Keeps the agent's MPS daemons and their limits as the daemons report them.

    Safe to share between the apply thread and the collector's health checks: the bookkeeping
    is under a lock (the control commands are not; applies are serialised by the agent).
    """

    def __init__(self, control: MpsControl, base_dir: Path = DEFAULT_BASE_DIR) -> None:
        self.control = control
        self.base_dir = base_dir
        self._limits: dict[str, MpsLimits] = {}
        self._adopted = False
        self._lock = threading.RLock()

    @property
    def state_file(self) -> Path:
        """``<base>/fleet-mps-state.json``."""
        return self.base_dir / STATE_FILE

    def daemon(self, target_uuid: str) -> MpsDaemon:
        """The directory layout for ``target_uuid``."""
        return MpsDaemon.for_target(self.base_dir, target_uuid)

    def managed_targets(self) -> list[str]:
        """Targets this agent started (or adopted) and has not stopped."""
        self._adopt()
        with self._lock:
            return sorted(self._limits)

    def limits(self, target_uuid: str) -> MpsLimits | None:
        """The limits the daemon last read back, or ``None`` if not managed."""
        self._adopt()
        with self._lock:
            return self._limits.get(target_uuid)

    # -- start, limits, stop ------------------------------------------------------------------

    def ensure(self, target_uuid: str, limits: MpsLimits) -> str:
        """Start the daemon if needed and put ``limits`` into effect; return a note ("" if none).

        ``limits`` go to the daemon's defaults (``set_default_*``, which servers spawned later
        take) and to every running server (``set_active_thread_percentage <server PID>``,
        ``set_device_pinned_mem_limit <server PID> 0 <N>M``): the limits a client's
        ``CUDA_MPS_*`` can only lower. Both settings are always sent: a removed thread limit as
        ``100``, a removed memory limit by restarting the daemon (MPS has no command to clear
        one). A running daemon whose defaults or servers differ is restarted when no client is
        connected; one with clients gets the per-server commands, which reach new clients only.

        Raises:
            MpsBusy: a memory limit must go but clients are connected (their PIDs).
            MpsError: a command failed, or the daemon reads back other limits than sent.
        """
        self._adopt()
        daemon = self.daemon(target_uuid)
        if self.control.on_host:
            prepare_directories(self.base_dir, daemon)
        wanted = limits.normalized()
        servers, clients = self._restart_if_idle(daemon, wanted)
        self._send_defaults(daemon, wanted)
        note = ""
        if servers:
            note = self._apply_to_servers(daemon, wanted, servers, clients)
        read = self._read_limits(daemon)
        self._record(target_uuid, read)
        if wanted.pinned_mem_limit_mib is None and read.pinned_mem_limit_mib is not None:
            raise MpsBusy(
                "MPS has no command to clear a pinned memory limit; the daemon restarts without "
                f"one once its {len(clients)} client(s) have left",
                clients,
            )
        if read != wanted:
            raise MpsError(f"MPS daemon for {target_uuid} reads back {read}, not {wanted}")
        logger.info("MPS daemon for %s ready with %s", target_uuid, read)
        return note

    def _restart_if_idle(
        self, daemon: MpsDaemon, wanted: MpsLimits
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Start the daemon; restart a running one whose defaults or servers hold other limits
        when no client is connected (a fresh daemon has MPS's defaults and no server). Return
        the live servers still to update, and their clients."""
        if not self.control.is_running(daemon):
            self.control.start(daemon)
            return (), ()
        servers = self._servers(daemon)
        if self._read_limits(daemon) == wanted and all(
            self._holds(self._server_limits(daemon, pid), wanted) for pid in servers
        ):
            return (), ()
        clients = self._clients(daemon, servers)
        if clients:
            return servers, clients
        self.control.stop(daemon)
        self.control.start(daemon)
        return (), ()

    @staticmethod
    def _holds(server: MpsLimits, wanted: MpsLimits) -> bool:
        """A server's limits are ``wanted`` (a memory limit it keeps where none is wanted is
        what the default check reports)."""
        if server.active_thread_percentage != wanted.active_thread_percentage:
            return False
        return wanted.pinned_mem_limit_mib in (None, server.pinned_mem_limit_mib)

    def _send_defaults(self, daemon: MpsDaemon, wanted: MpsLimits) -> None:
        self.control.command(
            daemon, f"set_default_active_thread_percentage {wanted.active_thread_percentage}"
        )
        if wanted.pinned_mem_limit_mib is not None:
            self.control.command(
                daemon,
                f"set_default_device_pinned_mem_limit {SINGLE_TARGET_DEVICE} "
                f"{wanted.pinned_mem_limit_mib}M",
            )

    def _apply_to_servers(
        self,
        daemon: MpsDaemon,
        wanted: MpsLimits,
        servers: tuple[int, ...],
        clients: tuple[int, ...],
    ) -> str:
        """``set_active_thread_percentage <server PID>`` / ``set_device_pinned_mem_limit <server
        PID> 0 <N>M``: the server's limits for clients created afterwards, read back."""
        for pid in servers:
            self.control.command(
                daemon, f"set_active_thread_percentage {pid} {wanted.active_thread_percentage}"
            )
            if wanted.pinned_mem_limit_mib is not None:
                self.control.command(
                    daemon,
                    f"set_device_pinned_mem_limit {pid} {SINGLE_TARGET_DEVICE} "
                    f"{wanted.pinned_mem_limit_mib}M",
                )
            read = self._server_limits(daemon, pid)
            if not self._holds(read, wanted):
                raise MpsError(f"MPS server {pid} reads back {read}, not {wanted}")
        return (
            f"set on the running MPS server; its {len(clients)} connected client(s) keep their "
            "limits until they restart"
        )

    def stop(self, target_uuid: str) -> None:
        """Stop the daemon for ``target_uuid`` (``quit``) unless clients are connected.

        Raises:
            MpsBusy: clients are connected (their PIDs); the daemon keeps running.
        """
        self._adopt()
        daemon = self.daemon(target_uuid)
        if self.control.is_running(daemon):
            clients = self._clients(daemon, self._servers(daemon))
            if clients:
                raise MpsBusy(f"{len(clients)} MPS client(s) are connected", clients)
            self.control.stop(daemon)
        with self._lock:
            self._limits.pop(target_uuid, None)
            self._save()

    # -- observation ---------------------------------------------------------------------------

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

    def status(self, target_uuid: str) -> MpsStatus | None:
        """The running daemon's limits (as last read back), servers and clients; ``None`` when
        it is not managed or does not answer."""
        limits = self.limits(target_uuid)
        if limits is None or not self.healthy(target_uuid):
            return None
        daemon = self.daemon(target_uuid)
        try:
            servers = self._servers(daemon)
            return MpsStatus(limits, servers, self._clients(daemon, servers))
        except MpsError as exc:
            logger.warning("MPS daemon for %s: %s", target_uuid, exc)
            return None

    def info(self, target_uuid: str) -> MpsDaemonInfo:
        """The wire view of one daemon, with the limits it read back."""
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

    def _servers(self, daemon: MpsDaemon) -> tuple[int, ...]:
        return parse_pids(self.control.command(daemon, "get_server_list"))

    def _clients(self, daemon: MpsDaemon, servers: tuple[int, ...]) -> tuple[int, ...]:
        pids: set[int] = set()
        for server in servers:
            pids.update(parse_pids(self.control.command(daemon, f"get_client_list {server}")))
        return tuple(sorted(pids))

    def _default_pinned(self, daemon: MpsDaemon) -> int | None:
        return parse_memory_mib(
            self.control.command(
                daemon, f"get_default_device_pinned_mem_limit {SINGLE_TARGET_DEVICE}"
            )
        )

    def _server_limits(self, daemon: MpsDaemon, server: int) -> MpsLimits:
        """``get_active_thread_percentage <server PID>`` and ``get_device_pinned_mem_limit
        <server PID> 0``: what the server's new clients get."""
        percent = parse_percentage(
            self.control.command(daemon, f"get_active_thread_percentage {server}")
        )
        memory = parse_memory_mib(
            self.control.command(
                daemon, f"get_device_pinned_mem_limit {server} {SINGLE_TARGET_DEVICE}"
            )
        )
        return MpsLimits(percent, memory)

    def _read_limits(self, daemon: MpsDaemon) -> MpsLimits:
        """Read back ``get_default_active_thread_percentage`` and
        ``get_default_device_pinned_mem_limit 0``."""
        percent = parse_percentage(
            self.control.command(daemon, "get_default_active_thread_percentage")
        )
        return MpsLimits(percent, self._default_pinned(daemon))

    # -- persistence and adoption (review D10) -------------------------------------------------

    def _record(self, target_uuid: str, limits: MpsLimits) -> None:
        with self._lock:
            self._limits[target_uuid] = limits
            self._save()

    def _save(self) -> None:
        """Write the state file atomically, 0600 (``on_host`` controls only)."""
        if not self.control.on_host:
            return
        prepare_directories(self.base_dir)
        data = {
            "version": 1,
            "daemons": {
                target: {
                    "active_thread_percentage": lim.active_thread_percentage,
                    "pinned_mem_limit_mib": lim.pinned_mem_limit_mib,
                }
                for target, lim in sorted(self._limits.items())
            },
        }
        fd, tmp = tempfile.mkstemp(prefix=".state-", dir=self.base_dir)
        try:
            os.fchmod(fd, STATE_MODE)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.state_file)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise MpsError(f"cannot write {self.state_file}: {exc.strerror}") from exc

    def _load(self) -> dict[str, MpsLimits]:
        if not self.control.on_host:
            return {}
        try:
            info = os.lstat(self.state_file)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                logger.warning("ignoring %s: not a file of the agent's user", self.state_file)
                return {}
            data: Any = json.loads(self.state_file.read_text(encoding="utf-8"))
            return {
                str(target): MpsLimits(
                    entry.get("active_thread_percentage"), entry.get("pinned_mem_limit_mib")
                )
                for target, entry in dict(data.get("daemons", {})).items()
            }
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            logger.warning("ignoring unreadable %s: %s", self.state_file, exc)
            return {}

    def _adopt(self) -> None:
        """Once: take over the daemons that run under the base directory (started by an
        earlier agent), with the limits they read back (the state file's if they do not
        answer). Daemons of the state file that are gone are forgotten."""
        with self._lock:
            if not self._adopted:
                self._adopted = True
                self._adopt_running()

    def _adopt_running(self) -> None:
        saved = self._load()
        try:
            running = self.control.running_targets(self.base_dir)
        except (OSError, MpsError) as exc:
            logger.warning("cannot look for MPS daemons in %s: %s", self.base_dir, exc)
            return
        for target in running:
            if target in self._limits:
                continue
            try:
                self._limits[target] = self._read_limits(self.daemon(target))
            except MpsError:
                self._limits[target] = saved.get(target, MpsLimits()).normalized()
            logger.info("adopted the MPS daemon of %s", target)
        if running or saved:
            try:
                self._save()
            except MpsError as exc:
                logger.warning("%s", exc)


def client_env(
    daemon: MpsDaemon, memory_mib: int | None, max_compute_percent: int | None
) -> dict[str, str]:
    """Environment for one MPS client (an allocation), ECS style.

    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` takes "``CUDA_VISIBLE_DEVICES``-style" device references,
    ordinals or UUIDs, each ``=<limit>`` (MPS doc, appendix "Environment Variables", example
    ``0=1G``). The client's ``CUDA_VISIBLE_DEVICES`` is the one target, so ordinal ``0`` names it
    without relying on MPS accepting ``MIG-`` UUIDs there (review D16).

    The MPS part of :func:`hostagent.protocol.workload_environment`, which every workload the
    agent starts gets (one formatter for both).
    """
    env = workload_environment(
        device_uuid=daemon.target_uuid,
        allocation_id=1,  # not part of the MPS variables returned
        deployment="",
        replica=0,
        mps_pipe_directory=str(daemon.pipe_directory),
        mps_memory_mib=memory_mib,
        mps_compute_percent=max_compute_percent,
    )
    return {
        k: v for k, v in env.items() if k == "CUDA_VISIBLE_DEVICES" or k.startswith("CUDA_MPS_")
    }
