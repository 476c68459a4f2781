"""The process runtime: each replica's command runs in a session (process group) of its own, as
the workload's user, with its output in a size-bounded log in the agent's state directory.

Why it is built this way:

* **A session per replica** (``setsid``): the group is what a stop signals, so helpers the
  command forks go with it, and the session ID names every process of the replica (process
  attribution, :mod:`hostagent.runtime.procfs`).
* **Output straight to a file**, not through a pipe the agent reads: a pipe would break (and
  ``SIGPIPE`` the workload) the moment the agent restarts. The log is bounded by copy and
  truncate (logrotate's ``copytruncate``): the file is opened ``O_APPEND``, so the workload
  writes on at the new end.
* **A state file** (``processes.json``, 0600, written atomically) holds each replica's PID and
  start time: a restarted agent finds its processes again and never mistakes a reused PID for
  one of them. Its exit status is known only to the agent process that started it (its
  parent); one that ends after an agent restart is reported with an unknown exit code.
"""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostagent.runtime import procfs
from hostagent.runtime.base import (
    BASE_LANG,
    BASE_PATH,
    Exit,
    Found,
    ReplicaSpec,
    Running,
    RuntimeName,
    StartError,
)
from hostagent.runtime.output import NoOutput, Output, tail_lines

logger = logging.getLogger(__name__)

STATE_FILE = "processes.json"
STATE_MODE = 0o600
LOG_MAX_BYTES = 10 * 2**20
"""A replica's log is rotated past this size; one rotated copy is kept (``.log.1``)."""
UNKNOWN_EXIT = "ended after an agent restart: its exit code is unknown"
_KILL_WAIT_S = 5.0
_POLL_S = 0.02


@dataclass(frozen=True)
class Identity:
    """Who a process workload runs as, and its home."""

    uid: int | None
    gid: int | None
    groups: list[int] | None
    home: str


def resolve_user(user: str | None) -> Identity:
    """``name``, ``uid``, ``name:group`` or ``uid:gid`` → ids; ``None``: the agent's own user.

    Raises:
        StartError: no such user or group, or the agent may not switch to it (not root).
    """
    if user is None:
        return Identity(None, None, None, os.environ.get("HOME") or _home_of(os.geteuid()))
    name, _, group = user.partition(":")
    try:
        entry = pwd.getpwuid(int(name)) if name.isdecimal() else pwd.getpwnam(name)
        uid, gid, home = entry.pw_uid, entry.pw_gid, entry.pw_dir
    except KeyError:
        if not name.isdecimal():
            raise StartError(f"no such user on this host: {name!r}") from None
        uid, gid, home = int(name), int(name), "/"
    if group:
        try:
            gid = int(group) if group.isdecimal() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise StartError(f"no such group on this host: {group!r}") from None
    if os.geteuid() != 0 and uid != os.geteuid():
        raise StartError(
            f"the agent runs as uid {os.geteuid()} and cannot start a workload as {user!r} "
            "(run the agent as root)"
        )
    groups = os.getgrouplist(name, gid) if not name.isdecimal() else [gid]
    return Identity(uid, gid, groups if os.geteuid() == 0 else None, home)


def _home_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"


def _credentials(identity: Identity) -> dict[str, Any]:
    if identity.uid is None:
        return {}
    creds: dict[str, Any] = {"user": identity.uid, "group": identity.gid}
    if identity.groups is not None:
        creds["extra_groups"] = identity.groups
    return creds


def workload_env(spec: ReplicaSpec, identity: Identity) -> dict[str, str]:
    """A minimal base (``PATH``, ``HOME``, ``LANG``), the workload's ``env``, Fleet's
    variables: nothing of the agent's own environment (its token) leaks into a workload."""
    base = {"PATH": BASE_PATH, "HOME": identity.home, "LANG": BASE_LANG}
    return {**base, **spec.full_environment()}


class ProcessRuntime:
    """Runs process workloads (see the module docstring). Thread-safe."""

    name: RuntimeName = "process"

    def __init__(self, state_dir: Path, *, log_max_bytes: int = LOG_MAX_BYTES) -> None:
        self.state_dir = state_dir
        self.log_dir = state_dir / "logs"
        self.log_max_bytes = log_max_bytes
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._table: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        for directory in (state_dir, self.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, 0o700)
        self._table = self._load()

    def log_path(self, allocation_id: int) -> Path:
        """``<state dir>/logs/<allocation id>.log``."""
        return self.log_dir / f"{allocation_id}.log"

    # -- start and stop -------------------------------------------------------------------

    def start(self, spec: ReplicaSpec) -> Running:
        """Start the command in a new session; raises :class:`StartError` saying why not."""
        workload = spec.workload
        if not workload["command"]:
            raise StartError("a process workload needs a command")
        identity = resolve_user(workload["user"])
        cwd = workload["cwd"] or "/"
        log = os.open(
            self.log_path(spec.allocation_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
        )
        try:
            child = subprocess.Popen(
                workload["command"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=workload_env(spec, identity),
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
                **_credentials(identity),
            )
        except OSError as exc:
            raise StartError(_start_failure(exc, workload["command"][0], cwd)) from exc
        finally:
            os.close(log)
        ticks = procfs.start_ticks(child.pid) or 0
        running = Running(
            allocation_id=spec.allocation_id,
            runtime="process",
            ident=f"{child.pid}:{ticks}",
            started_at=time.time(),
            pid=child.pid,
            gpu_uuid=spec.gpu_uuid,
            deployment=spec.deployment,
            stop_grace_s=workload["stop_grace_s"],
        )
        with self._lock:
            self._children[child.pid] = child
            self._table[str(spec.allocation_id)] = _entry(running, ticks)
            self._save()
        return running

    def stop(self, running: Running, grace_s: float) -> Exit:
        """SIGTERM to the group, up to ``grace_s`` for it to end, then SIGKILL."""
        ended = self._ended(running)
        if ended is not None:
            return ended
        self._signal(running, signal.SIGTERM)
        ended = self._wait(running, grace_s)
        if ended is not None:
            return ended
        logger.info(
            "allocation %s: no exit %.0f s after SIGTERM, killing", running.allocation_id, grace_s
        )
        self._signal(running, signal.SIGKILL)
        return self._wait(running, _KILL_WAIT_S) or Exit(None, "did not end after SIGKILL")

    def _signal(self, running: Running, sig: signal.Signals) -> None:
        """Signal the whole group, only if its leader is still ours (not a reused PID)."""
        pid = running.pid
        if pid is None or not self._is_ours(running):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def _is_ours(self, running: Running) -> bool:
        if running.pid in self._children:
            return self._children[running.pid].returncode is None
        return procfs.same_process(running.pid or 0, _ticks(running))

    def _wait(self, running: Running, timeout_s: float) -> Exit | None:
        deadline = time.monotonic() + timeout_s
        while True:
            ended = self._ended(running)
            if ended is not None or time.monotonic() >= deadline:
                return ended
            time.sleep(_POLL_S)

    def _ended(self, running: Running) -> Exit | None:
        """How the workload ended, or ``None`` while it runs. A child of ours is checked with
        ``waitid(WNOWAIT)``: its leftovers are killed while its PID (the group ID) is still
        held by the zombie, so the signal cannot reach a group that reused the number."""
        pid = running.pid or 0
        with self._lock:
            child = self._children.get(pid)
        if child is None:
            return None if procfs.same_process(pid, _ticks(running)) else Exit(None, UNKNOWN_EXIT)
        if child.returncode is not None:
            return Exit(child.returncode)
        try:
            status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped by another thread meanwhile
            code = child.poll()
            return None if code is None else Exit(code)
        if status is None:
            return None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        return Exit(child.wait())

    def observe(self, running: Sequence[Running]) -> dict[str, Exit]:
        """The workloads among ``running`` that have ended."""
        out = {}
        for r in running:
            ended = self._ended(r)
            if ended is not None:
                out[r.ident] = ended
        return out

    # -- adoption ---------------------------------------------------------------------------

    def find(self) -> list[Found]:
        """The processes of the state file: running if ``(pid, start time)`` still matches."""
        with self._lock:
            entries = list(self._table.values())
        found = []
        for entry in entries:
            running = _running(entry)
            if running is None:
                continue
            alive = self._ended(running) is None
            found.append(Found(running, None if alive else Exit(None, UNKNOWN_EXIT)))
        return found

    def discard(self, running: Running) -> None:
        """Drop the state entry (and the reaped child) of an ended workload."""
        with self._lock:
            key = str(running.allocation_id)
            if self._table.get(key, {}).get("ident") == running.ident:
                del self._table[key]
                self._save()
            child = self._children.get(running.pid or 0)
            if child is not None and child.returncode is not None:
                del self._children[running.pid or 0]

    # -- health and housekeeping -------------------------------------------------------------

    def exec_check(
        self, running: Running, spec: ReplicaSpec, command: list[str], timeout_s: float
    ) -> int:
        """Run ``command`` as the workload's user, with its environment and directory."""
        try:
            identity = resolve_user(spec.workload["user"])
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=workload_env(spec, identity),
                cwd=spec.workload["cwd"] or "/",
                timeout=timeout_s,
                check=False,
                start_new_session=True,
                **_credentials(identity),
            )
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"no answer within {timeout_s:g} s") from exc
        except (OSError, StartError):
            return 127
        return done.returncode

    def logs(self, allocation_id: int, tail: int) -> Output:
        """The last ``tail`` lines of the replica's log, its rotated copy too when the log
        holds fewer (see :func:`~hostagent.runtime.output.tail_lines`)."""
        path = self.log_path(allocation_id)
        try:
            return tail_lines([path, path.with_name(path.name + ".1")], tail)
        except NoOutput:
            raise NoOutput(f"allocation {allocation_id} has written no output yet") from None
        except OSError as exc:
            raise NoOutput(f"cannot read the log of allocation {allocation_id}: {exc}") from exc

    def maintain(self) -> None:
        """Rotate the logs grown past ``log_max_bytes`` (copy, then truncate in place)."""
        try:
            logs = list(self.log_dir.glob("*.log"))
        except OSError:
            return
        for path in logs:
            with contextlib.suppress(OSError):
                if path.stat().st_size > self.log_max_bytes:
                    shutil.copyfile(path, path.with_name(path.name + ".1"))
                    os.chmod(path.with_name(path.name + ".1"), 0o600)
                    os.truncate(path, 0)

    # -- state file ---------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.state_file.read_text(encoding="utf-8"))
            table = data["processes"]
            return {str(k): dict(v) for k, v in table.items() if isinstance(v, dict)}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning("ignoring unreadable %s: %s", self.state_file, exc)
            return {}

    def _save(self) -> None:
        write_json_atomic(self.state_file, {"version": 1, "processes": self._table})


def write_json_atomic(path: Path, data: object) -> None:
    """Write ``data`` as JSON to ``path``: a temporary file (0600) in the same directory,
    fsynced, then renamed over ``path``, so a crash leaves the old file or the new one."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        os.fchmod(fd, STATE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _entry(running: Running, ticks: int) -> dict[str, Any]:
    return {
        "allocation_id": running.allocation_id,
        "ident": running.ident,
        "pid": running.pid,
        "start_ticks": ticks,
        "started_at": running.started_at,
        "gpu_uuid": running.gpu_uuid,
        "deployment": running.deployment,
        "stop_grace_s": running.stop_grace_s,
    }


def _running(entry: dict[str, Any]) -> Running | None:
    try:
        return Running(
            allocation_id=int(entry["allocation_id"]),
            runtime="process",
            ident=str(entry["ident"]),
            started_at=float(entry["started_at"]),
            pid=int(entry["pid"]),
            gpu_uuid=entry.get("gpu_uuid"),
            deployment=str(entry.get("deployment", "")),
            stop_grace_s=int(entry.get("stop_grace_s", 30)),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _ticks(running: Running) -> int:
    _, _, ticks = running.ident.partition(":")
    return int(ticks) if ticks.isdecimal() else -1


def _start_failure(exc: OSError, program: str, cwd: str) -> str:
    if exc.filename == cwd or (isinstance(exc, NotADirectoryError) and exc.filename is None):
        return f"cannot enter the working directory {cwd!r}: {exc.strerror}"
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {program!r}"
    if isinstance(exc, PermissionError):
        return f"not allowed to run {program!r}: {exc.strerror}"
    return f"cannot start {program!r}: {exc.strerror or exc}"
