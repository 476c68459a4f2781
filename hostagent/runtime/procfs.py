"""What ``/proc`` says about a process: its identity over time, its session and its PID
namespace (``proc(5)``).

A PID alone does not name a process for long: once it exits, the kernel hands the number to
the next process. The start time (field 22 of ``/proc/<pid>/stat``, in clock ticks since
boot) does not repeat for a PID, so ``(pid, start ticks)`` is how the agent recognises its
process after a restart, and checks it before every signal it sends.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the agent uses."""

    pid: int
    state: str
    pgrp: int
    session: int
    start_ticks: int

    @property
    def zombie(self) -> bool:
        """Ended, not yet reaped (``Z``), or dead (``X``)."""
        return self.state in ("Z", "X")


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """``/proc/<pid>/stat``, or ``None`` when no such process exists (or it is unreadable)."""
    try:
        raw = (proc / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    _, _, rest = raw.rpartition(")")
    fields = rest.split()
    try:
        return ProcStat(pid, fields[0], int(fields[2]), int(fields[3]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``None`` if it does not exist)."""
    stat = read_stat(pid)
    return None if stat is None else stat.start_ticks


def same_process(pid: int, ticks: int) -> bool:
    """Whether ``pid`` is still the live process that started at ``ticks``."""
    stat = read_stat(pid)
    return stat is not None and not stat.zombie and stat.start_ticks == ticks


def pid_namespace(pid: int, proc: Path = PROC) -> str | None:
    """The PID namespace of ``pid`` (``pid:[4026531836]``), or ``None`` if unreadable (another
    user's process without ``CAP_SYS_PTRACE``, or gone)."""
    try:
        return os.readlink(proc / str(pid) / "ns" / "pid")
    except OSError:
        return None


def all_pids(proc: Path = PROC) -> list[int]:
    """Every PID in ``/proc``."""
    try:
        return [int(name) for name in os.listdir(proc) if name.isdecimal()]
    except OSError:
        return []


@dataclass(frozen=True)
class Leaders:
    """The workloads to attribute processes to: process groups by their session leader's PID
    (``start_new_session``: session ID = leader PID), containers by their init's PID."""

    sessions: Mapping[int, int]
    """Session leader PID → allocation ID."""
    containers: Mapping[int, int]
    """Container init PID → allocation ID."""


def owners(pids: Iterable[int], leaders: Leaders) -> dict[int, int]:
    """Allocation ID of each of ``pids`` that belongs to a workload: same session as a process
    workload's leader, or same PID namespace as a container's init."""
    namespaces: dict[str, int] = {}
    for init, allocation in leaders.containers.items():
        ns = pid_namespace(init)
        # The host's own namespace would claim every process: a container always has its own.
        if ns is not None and ns != _host_namespace():
            namespaces[ns] = allocation
    found: dict[int, int] = {}
    for pid in pids:
        stat = read_stat(pid)
        if stat is not None and stat.session in leaders.sessions:
            found[pid] = leaders.sessions[stat.session]
        elif namespaces and (ns := pid_namespace(pid)) in namespaces:
            found[pid] = namespaces[ns]
    return found


def members(leaders: Leaders) -> dict[int, list[int]]:
    """Allocation ID → every PID of its workload (one scan of ``/proc``)."""
    found = owners(all_pids(), leaders)
    out: dict[int, list[int]] = {}
    for pid, allocation in sorted(found.items()):
        out.setdefault(allocation, []).append(pid)
    return out


def _host_namespace() -> str | None:
    return pid_namespace(os.getpid())


_TCP_LISTEN = "0A"


def listening_inodes(port: int, proc: Path = PROC) -> set[int]:
    """The socket inodes that listen on TCP ``port`` (any address, IPv4 or IPv6) in the
    agent's network namespace (``/proc/net/tcp``, ``/proc/net/tcp6``)."""
    found: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            _, _, hex_port = fields[1].rpartition(":")
            if int(hex_port, 16) == port and fields[9].isdecimal():
                found.add(int(fields[9]))
    return found


def socket_inodes(pid: int, proc: Path = PROC) -> set[int]:
    """The socket inodes among ``pid``'s open files (``socket:[<inode>]`` links)."""
    inodes: set[int] = set()
    fd_dir = proc / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1].isdecimal():
            inodes.add(int(target[8:-1]))
    return inodes


def session_listens(port: int, leader: int, proc: Path = PROC) -> bool:
    """Whether a process of the session ``leader`` leads (a process workload) holds a socket
    that listens on ``port``: the answer on that port is the replica's, not a squatter's."""
    listeners = listening_inodes(port, proc)
    if not listeners:
        return False
    for pid in all_pids(proc):
        stat = read_stat(pid, proc)
        if stat is not None and stat.session == leader and socket_inodes(pid, proc) & listeners:
            return True
    return False


_TCP_ESTABLISHED = "01"


def established(pid: int, ports: Iterable[int], proc: Path = PROC) -> int | None:
    """The TCP connections established on one of ``ports`` (the local side: the ones a server
    listening there accepted) in ``pid``'s network namespace (``/proc/<pid>/net/tcp``,
    ``tcp6``), or ``None`` when neither table can be read (the process is gone, another
    namespace hides it): not known, never 0."""
    wanted = set(ports)
    count, read = 0, False
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / str(pid) / "net" / table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        read = True
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _TCP_ESTABLISHED:
                continue
            _, _, hex_port = fields[1].rpartition(":")
            try:
                if int(hex_port, 16) in wanted:
                    count += 1
            except ValueError:
                continue
    return count if read else None
