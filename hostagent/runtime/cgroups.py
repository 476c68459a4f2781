"""Memory and PID limits of process workloads: one cgroup v2 child per replica.

Each replica gets ``<base>/fleet-<allocation id>`` with ``memory.max`` (its host memory) and
``pids.max`` (its PID limit); the process enters it before it runs anything (the runtime writes
``0`` to the child's ``cgroup.procs`` from the forked child, which moves the writer), so nothing
it forks escapes the limits. ``<base>`` is the agent's own cgroup (``/proc/self/cgroup``, the
``0::`` line: ``/system.slice/fleet-agent.service`` under systemd with ``Delegate=yes``) or a
configured one.

cgroup v2's "no internal processes" rule: a cgroup that holds processes cannot hand controllers
to its children. So when the agent itself sits in ``<base>``, it first moves into a leaf of its
own (``<base>/agent``), then enables ``+memory +pids`` in ``<base>/cgroup.subtree_control``, as
systemd documents for delegated services (systemd.resource-control, "Delegate=").

Where none of this is possible (cgroup v1, no delegation, not root), :meth:`Cgroups.available`
is false and says why; the runtime then falls back to ``RLIMIT_NPROC`` and says memory is not
confined. Paths are built under ``root`` so tests use a temporary directory for it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")
AGENT_LEAF = "agent"
PREFIX = "fleet-"


def own_cgroup(proc_self_cgroup: str) -> str | None:
    """The cgroup v2 path of ``/proc/self/cgroup``'s ``0::<path>`` line (``None`` on a host
    with cgroup v1 only)."""
    for line in proc_self_cgroup.splitlines():
        hierarchy, _, path = line.partition("::")
        if hierarchy == "0" and path.startswith("/"):
            return path
    return None


def _read(path: Path) -> str:
    return path.read_text(encoding="ascii").strip()


def _write(path: Path, value: str) -> None:
    # cgroupfs files take one write each; no truncation, no temporary file.
    with path.open("w", encoding="ascii") as fh:
        fh.write(value)


class Cgroups:
    """The replicas' cgroups under one base (see the module docstring).

    Args:
        root: the cgroup v2 mount (``/sys/fs/cgroup``).
        base: the base path below ``root`` (``/system.slice/fleet-agent.service``); ``None``:
            the agent's own cgroup.
        pid: the agent's PID, moved into ``<base>/agent`` when it sits in ``<base>``.
    """

    def __init__(self, root: Path = DEFAULT_ROOT, base: str | None = None, pid: int = 0) -> None:
        self.root = root
        self.pid = pid or os.getpid()
        self.problem: str | None = None
        self.base = self._base(base)
        if self.base is not None:
            self.problem = self._prepare(self.base)

    def _base(self, base: str | None) -> Path | None:
        if base is None:
            try:
                base = own_cgroup(Path(f"/proc/{self.pid}/cgroup").read_text(encoding="ascii"))
            except OSError as exc:
                self.problem = f"cannot read the agent's cgroup: {exc.strerror}"
                return None
            if base is None:
                self.problem = "this host has no cgroup v2 hierarchy (cgroup v1 only)"
                return None
        return self.root / base.strip("/")

    @property
    def available(self) -> bool:
        """Whether replicas get cgroups (else :attr:`problem` says why not)."""
        return self.base is not None and self.problem is None

    def _prepare(self, base: Path) -> str | None:
        """Make ``base`` a parent whose children may use memory and pids; return why not."""
        try:
            available = _read(base / "cgroup.controllers").split()
            missing = [c for c in CONTROLLERS if c not in available]
            if missing:
                return f"the cgroup {base} cannot use the {' and '.join(missing)} controller"
            enabled = _read(base / "cgroup.subtree_control").split()
            if all(c in enabled for c in CONTROLLERS):
                return None
            if str(self.pid) in _read(base / "cgroup.procs").split():
                leaf = base / AGENT_LEAF
                leaf.mkdir(exist_ok=True)
                _write(leaf / "cgroup.procs", str(self.pid))
            _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
        except OSError as exc:
            return f"cannot delegate the memory and pids controllers in {base}: {exc.strerror}"
        return None

    def path(self, allocation_id: int) -> Path:
        """``<base>/fleet-<allocation id>``."""
        if self.base is None:
            raise RuntimeError(self.problem or "no cgroup base")
        return self.base / f"{PREFIX}{allocation_id}"

    def create(self, allocation_id: int, *, memory_mib: int | None, pids_limit: int) -> Path:
        """The replica's cgroup with its limits (made again if a previous run left it).

        Raises:
            OSError: the cgroup or one of its limits cannot be written.
        """
        path = self.path(allocation_id)
        path.mkdir(exist_ok=True)
        _write(path / "pids.max", str(pids_limit))
        memory = "max" if memory_mib is None else str(memory_mib * 2**20)
        _write(path / "memory.max", memory)
        swap = path / "memory.swap.max"
        if memory_mib is not None and swap.exists():
            # Without this the limit only moves the excess to swap.
            _write(swap, "0")
        return path

    def remove(self, allocation_id: int) -> None:
        """Remove the replica's cgroup once its processes are gone (cgroupfs refuses to remove
        a cgroup that still has some: it is then left for the next start to reuse)."""
        if self.base is None:
            return
        path = self.path(allocation_id)
        with contextlib.suppress(FileNotFoundError):
            try:
                path.rmdir()
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY and not _holds_processes(path):  # a plain dir
                    _remove_tree(path)
                else:
                    logger.info("cgroup %s not removed: %s", path, exc.strerror)


def _holds_processes(path: Path) -> bool:
    try:
        return bool(_read(path / "cgroup.procs"))
    except OSError:
        return False


def _remove_tree(path: Path) -> None:
    """A directory standing in for a cgroup (tests): its files go first."""
    for child in path.iterdir():
        with contextlib.suppress(OSError):
            child.unlink()
    with contextlib.suppress(OSError):
        path.rmdir()
