"""Where MPS daemons live on disk, and the directory checks that keep non-root clients working
without letting another user redirect the agent (review D4)."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BASE_DIR = Path("/run/fleet-mps")
PID_FILE = "nvidia-cuda-mps-control.pid"
DIRECTORY_MODE = 0o755
"""Pipe, log and parent directories: the control daemon starts each MPS server with the UID of its
client (``nvidia-cuda-mps-control(1)``), so a non-root server must reach them. NVIDIA's k8s device
plugin creates both with 0755 (``cmd/mps-control-daemon/mps/daemon.go``); 0700 gave EACCES
(bottlerocket#4673, review D4)."""
SINGLE_TARGET_DEVICE = "0"
"""The ``<dev>`` of a daemon that sees one device: with ``CUDA_VISIBLE_DEVICES=<uuid>`` set on
the daemon, ordinals are relative to it (k8s-device-plugin#2056), so ``0`` is its target. MPS
documents "ordinal or UUID"; whether MIG UUIDs are accepted is unverified (review D16)."""


class MpsError(Exception):
    """The daemon did not start, did not answer, or refused a command."""


class MpsBusy(MpsError):
    """MPS clients are connected where the change needs none (``pids``: the clients)."""

    def __init__(self, message: str, pids: tuple[int, ...]) -> None:
        super().__init__(message)
        self.pids = pids


class UnsafeDirectory(MpsError):
    """An MPS directory is a symlink, not a directory, or not owned by the agent's user."""


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

    @property
    def root(self) -> Path:
        """``<base>/<uuid>``."""
        return self.pipe_directory.parent

    def environment(self) -> dict[str, str]:
        """The daemon's environment additions."""
        return {
            "CUDA_VISIBLE_DEVICES": self.target_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_directory),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_directory),
        }


def secure_directory(path: Path, mode: int = DIRECTORY_MODE) -> None:
    """Create ``path`` if missing, refuse it unless it is a real directory owned by this user,
    and set ``mode`` explicitly.

    ``os.mkdir``'s mode is masked by the umask and never applied to an existing directory, so the
    mode is set with ``fchmod`` on a descriptor opened with ``O_NOFOLLOW``: a symlink swapped in
    after the check cannot redirect it.

    Raises:
        UnsafeDirectory: a symlink, not a directory, or owned by another user.
        MpsError: the directory cannot be created or opened.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise MpsError(f"cannot create {path}: {exc.strerror}") from exc
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeDirectory(f"{path} is a symlink; refusing it as an MPS directory")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeDirectory(f"{path} changed under the agent: {exc.strerror}") from exc
        raise MpsError(f"cannot open {path}: {exc.strerror}") from exc
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():
            raise UnsafeDirectory(
                f"{path} is owned by UID {owner}, not by the agent (UID {os.geteuid()})"
            )
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _create_ancestors(base_dir: Path) -> None:
    """Create the missing ancestors of ``base_dir`` one level at a time (0755, explicit chmod);
    existing ones (``/run``, ``/var/lib``) are the system's and left as they are."""
    for parent in reversed(base_dir.parents):
        if os.path.lexists(parent):
            continue
        try:
            os.mkdir(parent, 0o700)
            os.chmod(parent, DIRECTORY_MODE)
        except FileExistsError:
            continue
        except OSError as exc:
            raise MpsError(f"cannot create {parent}: {exc.strerror}") from exc


def prepare_directories(base_dir: Path, daemon: MpsDaemon | None = None) -> None:
    """Secure the base directory and, with ``daemon``, its ``<uuid>``, ``pipe`` and ``log``
    directories (0755 each, owned by the agent's user)."""
    _create_ancestors(base_dir)
    secure_directory(base_dir)
    if daemon is not None:
        for path in (daemon.root, daemon.pipe_directory, daemon.log_directory):
            secure_directory(path)
