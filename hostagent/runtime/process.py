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
* **Never root, never the agent's own user** (review H1): the workload runs as ``security.user``
  (:func:`resolve_user` refuses uid 0 without ``allow_root``, the agent's uid, no user at all),
  with that user's groups only, its environment built from scratch. The agent's state
  directory (0700) and token file (0600) are then out of its reach. ``as_agent_user`` (the
  agent's ``--process-as-agent-user``, for development and demos on one's own machine) keeps
  the old way: a workload without a user runs as the agent's user.
* **Limits**: a cgroup v2 child per replica (:mod:`hostagent.runtime.cgroups`: ``memory.max``,
  ``pids.max``) entered before the command runs; where the agent cannot write cgroups,
  ``RLIMIT_NPROC`` for the workload's user, and a line in the replica's log saying that its
  memory is not confined. The cgroup entry and the user switch happen in the forked child, in
  that order (a ``preexec_fn``: once switched, the child could not enter the cgroup).
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
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostagent.protocol import DEFAULT_STOP_GRACE_S, Security
from hostagent.runtime import procfs
from hostagent.runtime.base import (
    BASE_LANG,
    BASE_PATH,
    PROCESS_RUNTIME_OFF,
    Exit,
    Found,
    ReplicaSpec,
    Running,
    RuntimeName,
    StartError,
)
from hostagent.runtime.cgroups import Cgroups
from hostagent.runtime.output import (
    RING_BYTES,
    RING_LINES,
    NoOutput,
    Output,
    OutputRing,
    tail_lines,
)

logger = logging.getLogger(__name__)

STATE_FILE = "processes.json"
STATE_MODE = 0o600
LOG_MAX_BYTES = 10 * 2**20
"""A replica's log is rotated past this size; one rotated copy is kept (``.log.1``)."""
RING_LINES_READ = RING_LINES
"""Lines read from a log file into a ring at once (the ring keeps its own bounds)."""
UNKNOWN_EXIT = "ended after an agent restart: its exit code is unknown"
_KILL_WAIT_S = 5.0
_POLL_S = 0.02
_CAP_SETGID, _CAP_SETUID = 6, 7


@dataclass(frozen=True)
class Identity:
    """Who a process workload runs as, and its home; ``uid`` ``None``: the agent's own user
    (no switch, ``as_agent_user`` only)."""

    uid: int | None
    gid: int | None
    groups: list[int] | None
    home: str


def resolve_user(
    user: str | None, *, allow_root: bool = False, as_agent_user: bool = False
) -> Identity:
    """``name``, ``uid``, ``name:group`` or ``uid:gid`` → ids (``pwd``/``grp``).

    ``as_agent_user``: a workload without a user, or with the agent's own, runs as the agent's
    user (development only: it can read the agent's token).

    Raises:
        StartError: no user, no such user or group, root without ``allow_root``, the agent's
            own user, or an agent that cannot switch users (neither root nor ``CAP_SETUID``).
    """
    agent = os.geteuid()
    if user is None:
        if as_agent_user:
            return Identity(None, None, None, _home_of(agent))
        raise StartError(
            "a process workload needs a user to run as (never the agent's own): ask an admin "
            "to set the team's process_user"
        )
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
    if uid == 0 and not allow_root:
        raise StartError(
            f"refusing to run a process workload as root ({user!r}): set the team's "
            "process_user to a non-root uid, or ask an admin to allow root"
        )
    if uid == agent and uid != 0:
        if as_agent_user:
            return Identity(None, None, None, home)
        raise StartError(
            f"refusing to run a process workload as the agent's own user (uid {agent}, "
            f"{user!r}): it could read the agent's token; use another user"
        )
    if not can_switch_users():
        raise StartError(
            f"the agent runs as uid {agent} without CAP_SETUID and CAP_SETGID and cannot "
            f"start a workload as {user!r}: run the agent as root (the packaged service does)"
        )
    # Only the target user's own groups: none of the agent's (root's) supplementary groups.
    groups = os.getgrouplist(name, gid) if not name.isdecimal() else [gid]
    return Identity(uid, gid, groups, home)


def can_switch_users(status: str | None = None) -> bool:
    """Root, or ``CAP_SETUID`` and ``CAP_SETGID`` in the effective set (``CapEff`` of
    ``/proc/self/status``)."""
    if os.geteuid() == 0:
        return True
    try:
        text = Path("/proc/self/status").read_text(encoding="ascii") if status is None else status
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            caps = int(line.split()[1], 16)
            return bool(caps >> _CAP_SETUID & 1 and caps >> _CAP_SETGID & 1)
    return False


def _home_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"


def _preexec(identity: Identity, cgroup_procs: int | None, nproc: int | None) -> Callable[[], None]:
    """What the forked child does before ``exec``: enter the replica's cgroup (``0`` moves the
    writer), drop to the workload's user and groups, cap its processes. Only system calls: the
    agent has threads, and a ``preexec_fn`` must not take a lock another thread held at fork
    time (Python's warning), so no logging, no imports here."""

    def enter() -> None:
        if cgroup_procs is not None:
            os.write(cgroup_procs, b"0")
        if identity.uid is not None and identity.gid is not None:
            os.setgroups(identity.groups or [identity.gid])
            os.setgid(identity.gid)
            os.setuid(identity.uid)
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return enter


def workload_env(spec: ReplicaSpec, identity: Identity) -> dict[str, str]:
    """A minimal base (``PATH``, ``HOME``, ``LANG``), the workload's ``env``, Fleet's
    variables: nothing of the agent's own environment (its token) leaks into a workload."""
    base = {"PATH": BASE_PATH, "HOME": identity.home, "LANG": BASE_LANG}
    return {**base, **spec.full_environment()}


class ProcessRuntime:
    """Runs process workloads (see the module docstring). Thread-safe.

    Args:
        state_dir: the state file and the logs (made 0700).
        allow_start: the agent runs process workloads (``--allow-process-runtime``); without
            it, :attr:`refusal` says why none starts, and the ones an earlier agent started are
            still found and stopped.
        as_agent_user: a workload without a user runs as the agent's (development only).
        cgroups: the replicas' cgroups; ``None`` or unavailable: ``RLIMIT_NPROC`` only.
    """

    name: RuntimeName = "process"

    def __init__(
        self,
        state_dir: Path,
        *,
        log_max_bytes: int = LOG_MAX_BYTES,
        allow_start: bool = True,
        as_agent_user: bool = False,
        cgroups: Cgroups | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.log_dir = state_dir / "logs"
        self.log_max_bytes = log_max_bytes
        self.refusal: str | None = None if allow_start else PROCESS_RUNTIME_OFF
        self.as_agent_user = as_agent_user
        self.cgroups = cgroups
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._table: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        # Captured output (module docstring of hostagent.runtime.output): a ring and the
        # (inode, offset) read so far, per replica this runtime runs or ran since the agent began.
        self._rings: dict[int, OutputRing] = {}
        self._read_to: dict[int, tuple[int, int]] = {}
        self._capture_lock = threading.Lock()
        for directory in (state_dir, self.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, 0o700)
        self._table = self._load()

    def log_path(self, allocation_id: int) -> Path:
        """``<state dir>/logs/<allocation id>.log``."""
        return self.log_dir / f"{allocation_id}.log"

    def identity(self, security: Security) -> Identity:
        """Who a workload with this ``security`` runs as (:func:`resolve_user`)."""
        return resolve_user(
            security["user"], allow_root=security["allow_root"], as_agent_user=self.as_agent_user
        )

    # -- start and stop -------------------------------------------------------------------

    def start(self, spec: ReplicaSpec) -> Running:
        """Start the command in a new session, in its cgroup, as its user; raises
        :class:`StartError` saying why not."""
        if self.refusal is not None:
            raise StartError(self.refusal)
        workload, security = spec.workload, spec.confinement()
        if not workload["command"]:
            raise StartError("a process workload needs a command")
        identity = self.identity(security)
        cwd = workload["cwd"] or "/"
        log = os.open(
            self.log_path(spec.allocation_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
        )
        written_before = os.fstat(log).st_size
        procs = None
        try:
            procs, nproc = self._limits(spec.allocation_id, security, identity, log)
            child = subprocess.Popen(
                workload["command"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=workload_env(spec, identity),
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_preexec(identity, procs, nproc),  # see _preexec
            )
        except OSError as exc:
            raise StartError(_start_failure(exc, workload["command"][0], cwd)) from exc
        except subprocess.SubprocessError as exc:  # the preexec failed
            raise StartError(
                f"cannot confine the workload or switch to user {security['user']!r}: {exc}"
            ) from exc
        finally:
            os.close(log)
            if procs is not None:
                os.close(procs)
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
            host_ports=dict(spec.host_ports),
        )
        # The capture lock first (the order capture() takes them in): the supervision tick must
        # not read the new replica's log before the first capture below, which stamps what the
        # replica printed from its start (a tick's first read would leave it unstamped).
        with self._capture_lock:
            with self._lock:
                self._children[child.pid] = child
                self._table[str(spec.allocation_id)] = _entry(running, ticks)
                self._save()
            with contextlib.suppress(OSError):
                # An earlier run's output is not stamped (a restart on the same allocation goes
                # on in its ring: cursors keep increasing).
                self._capture_one(spec.allocation_id, time.time(), stamped_from=written_before)
        return running

    def _limits(
        self, allocation_id: int, security: Security, identity: Identity, log: int
    ) -> tuple[int | None, int | None]:
        """The replica's cgroup (an open ``cgroup.procs``) or, where there is none, the
        ``RLIMIT_NPROC`` to set; when the agent has cgroups but cannot give this replica one,
        what is not confined is said in the replica's log (an agent built without cgroups, as
        the simulated swarm's, says nothing)."""
        why = ""
        if self.cgroups is not None and self.cgroups.available:
            try:
                path = self.cgroups.create(
                    allocation_id,
                    memory_mib=security["memory_mib"],
                    pids_limit=security["pids_limit"],
                )
                return os.open(path / "cgroup.procs", os.O_WRONLY), None
            except OSError as exc:
                why = f"cannot write its cgroup: {exc.strerror or exc}"
        elif self.cgroups is not None:
            why = self.cgroups.problem or "no cgroup"
        # RLIMIT_NPROC counts every process of the user, and root ignores it: it means
        # something only for a user of the workload's own (Nomad's exec driver has the same).
        nproc = security["pids_limit"] if identity.uid not in (None, 0) else None
        if not why:
            return None, nproc
        pids = f"PIDs capped by RLIMIT_NPROC={nproc} for uid {identity.uid}" if nproc else ""
        note = f"fleet: {why}: the workload's memory is not confined" + (
            f"; {pids}" if pids else "; its PIDs are not limited"
        )
        logger.warning("allocation %s: %s", allocation_id, note)
        os.write(log, (note + "\n").encode())
        return None, nproc

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
        if self.cgroups is not None and self.cgroups.available:
            self.cgroups.remove(running.allocation_id)

    # -- health and housekeeping -------------------------------------------------------------

    def exec_check(
        self, running: Running, spec: ReplicaSpec, command: list[str], timeout_s: float
    ) -> int:
        """Run ``command`` as the workload's user, with its environment and directory."""
        try:
            security = spec.confinement()
            identity = self.identity(security)
            nproc = security["pids_limit"] if identity.uid not in (None, 0) else None
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
                preexec_fn=_preexec(identity, None, nproc),  # see _preexec
            )
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"no answer within {timeout_s:g} s") from exc
        except (OSError, StartError, subprocess.SubprocessError):
            return 127
        return done.returncode

    def logs(self, allocation_id: int, tail: int, *, before: int | None = None) -> Output:
        """The newest ``tail`` lines of the replica's output older than cursor ``before``,
        stamped, from its ring (captured just now first). A replica with no ring
        (one that ended before this agent began) is read from its log and its rotated copy,
        without stamps."""
        path = self.log_path(allocation_id)
        try:
            with self._capture_lock:
                if str(allocation_id) in self._known():
                    self._capture_one(allocation_id, time.time())
                ring = self._rings.get(allocation_id)
                if ring is not None:
                    return ring.page(tail, before=before)
            found = tail_lines([path, path.with_name(path.name + ".1")], RING_LINES_READ)
        except NoOutput:
            raise NoOutput(f"allocation {allocation_id} has written no output yet") from None
        except OSError as exc:
            raise NoOutput(f"cannot read the log of allocation {allocation_id}: {exc}") from exc
        ring = OutputRing()
        if found.truncated:
            ring.drop_older()
        ring.add(found.lines, None)
        return ring.page(tail, before=before)

    def capture(self) -> None:
        """Read what each running replica's log grew by into its ring, stamped now (see
        :mod:`hostagent.runtime.output`); forget the rings of replicas no longer run."""
        now = time.time()
        with self._capture_lock:
            known = self._known()
            for allocation_id in [a for a in self._rings if str(a) not in known]:
                del self._rings[allocation_id]
                self._read_to.pop(allocation_id, None)
            for key in known:
                with contextlib.suppress(OSError, ValueError):
                    self._capture_one(int(key), now)

    def _known(self) -> set[str]:
        with self._lock:
            return set(self._table)

    def _capture_one(self, allocation_id: int, now: float, stamped_from: int | None = None) -> None:
        """Under ``_capture_lock``: append the log's new bytes to the replica's ring. The first
        time, what the log (and its rotated copy) already holds goes in unstamped (but for the
        bytes from offset ``stamped_from`` on, written by a replica this agent just started); a
        log that shrank or is another file was rotated: read from its start."""
        path = self.log_path(allocation_id)
        try:
            with path.open("rb") as log:
                st = os.fstat(log.fileno())
                ring = self._rings.get(allocation_id)
                if ring is None:
                    ring = self._rings[allocation_id] = OutputRing()
                    with contextlib.suppress(NoOutput):  # none rotated yet
                        found = tail_lines([path.with_name(path.name + ".1")], RING_LINES_READ)
                        if found.truncated:
                            ring.drop_older()
                        ring.add(found.lines, None)
                    start = max(0, st.st_size - RING_BYTES)
                    if start:
                        ring.drop_older()
                    log.seek(start)
                    existing = log.read(st.st_size - start)
                    seen = st.st_size if stamped_from is None else stamped_from
                    seen = max(0, min(len(existing), seen - start))
                    ring.capture(existing[:seen], None)
                    ring.capture(existing[seen:], now)
                    self._read_to[allocation_id] = (st.st_ino, start + len(existing))
                    return
                inode, offset = self._read_to.get(allocation_id, (st.st_ino, 0))
                if inode != st.st_ino or st.st_size < offset:
                    offset = 0
                grown = st.st_size - offset
                if grown > RING_BYTES:  # more than the ring keeps in one tick
                    ring.drop_older()
                    offset = st.st_size - RING_BYTES
                log.seek(offset)
                raw = log.read(st.st_size - offset)
                ring.capture(raw, now)
                self._read_to[allocation_id] = (st.st_ino, offset + len(raw))
        except FileNotFoundError:
            return

    def maintain(self) -> None:
        """Rotate the logs grown past ``log_max_bytes`` (copy, then truncate in place), each
        captured first: its ring misses only what is written between the two."""
        try:
            logs = list(self.log_dir.glob("*.log"))
        except OSError:
            return
        for path in logs:
            with contextlib.suppress(OSError):
                if path.stat().st_size > self.log_max_bytes:
                    with self._capture_lock:
                        known = path.stem in self._known() and path.stem.isdigit()
                        if known:
                            self._capture_one(int(path.stem), time.time())
                        shutil.copyfile(path, path.with_name(path.name + ".1"))
                        os.chmod(path.with_name(path.name + ".1"), 0o600)
                        os.truncate(path, 0)
                        if known and int(path.stem) in self._read_to:
                            inode, _ = self._read_to[int(path.stem)]
                            self._read_to[int(path.stem)] = (inode, 0)

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
        "host_ports": running.host_ports,
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
            stop_grace_s=int(entry.get("stop_grace_s", DEFAULT_STOP_GRACE_S)),
            host_ports={str(k): int(v) for k, v in dict(entry.get("host_ports") or {}).items()},
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
