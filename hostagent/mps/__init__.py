"""MPS control daemons: one per GPU or per MIG instance, each with its own pipe and log directory.

The daemon is ``nvidia-cuda-mps-control -d`` started with ``CUDA_VISIBLE_DEVICES=<GPU or MIG
UUID>``, ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` under
``<base>/<uuid>/pipe|log`` (``/run/fleet-mps`` by default, root-owned, never world-writable
``/tmp``). Limits are set by writing control commands to the daemon's stdin interface and read
back (MPS v2 interface, ``mpsv2-interface.html``); health is
"``get_default_active_thread_percentage`` answers", as the k8s device plugin checks it. Clients
get the environment from :func:`client_env` (``CUDA_MPS_PIPE_DIRECTORY``,
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), the way ECS sets
them per task; a client can only lower what its server holds, so the daemon and its servers hold
the shares' own limits (:func:`daemon_limits`, see :mod:`hostagent.mps.limits`).

What the manager keeps (review D9, D10, D15, D16):

* ``set_default_*`` only reaches servers spawned later and is lost on ``quit``. A running server
  without clients is therefore restarted; one with clients gets ``set_active_thread_percentage
  <server PID>`` / ``set_device_pinned_mem_limit <server PID> 0 <N>M`` (new clients only). MPS has
  no command that clears a pinned limit, so removing one waits until the clients have left.
* What the daemon answers to ``get_default_*`` is what the agent reports, not what it asked for.
* Daemons outlive the agent: their targets and limits sit in ``<base>/fleet-mps-state.json``
  (0600, written atomically), and running daemons are adopted from their pid files at start.
* ``quit`` is refused while clients are connected (:class:`MpsBusy` with their PIDs).
"""

from __future__ import annotations

from hostagent.mps.control import (
    MPS_CONTROL_BINARY,
    MpsControl,
    SubprocessMpsControl,
    check_answer,
    parse_memory_mib,
    parse_percentage,
    parse_pids,
)
from hostagent.mps.layout import (
    DEFAULT_BASE_DIR,
    DIRECTORY_MODE,
    PID_FILE,
    SINGLE_TARGET_DEVICE,
    MpsBusy,
    MpsDaemon,
    MpsError,
    UnsafeDirectory,
    prepare_directories,
    secure_directory,
)
from hostagent.mps.limits import (
    DEFAULT_THREAD_PERCENTAGE,
    MpsLimits,
    daemon_limits,
    enforced_by_daemon,
    share_limits,
)
from hostagent.mps.manager import (
    STATE_FILE,
    STATE_MODE,
    MpsManager,
    MpsStatus,
    client_env,
)

__all__ = [
    "DEFAULT_BASE_DIR",
    "DEFAULT_THREAD_PERCENTAGE",
    "DIRECTORY_MODE",
    "MPS_CONTROL_BINARY",
    "PID_FILE",
    "SINGLE_TARGET_DEVICE",
    "STATE_FILE",
    "STATE_MODE",
    "MpsBusy",
    "MpsControl",
    "MpsDaemon",
    "MpsError",
    "MpsLimits",
    "MpsManager",
    "MpsStatus",
    "SubprocessMpsControl",
    "UnsafeDirectory",
    "check_answer",
    "client_env",
    "daemon_limits",
    "enforced_by_daemon",
    "parse_memory_mib",
    "parse_percentage",
    "parse_pids",
    "prepare_directories",
    "secure_directory",
    "share_limits",
]
