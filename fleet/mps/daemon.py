"""The settings that put MPS rules into effect: client environment and control-daemon commands.

Stdlib only: importing this module never boots Django.
"""

from __future__ import annotations

import re

from fleet.mps.values import MAX_COMPUTE_PERCENT, MpsPolicy, MpsRequest, validate_request

# A device reference as CUDA_VISIBLE_DEVICES spells one: an ordinal, a GPU UUID, or a MIG UUID (both
# the R470+ ``MIG-<uuid>`` and the older ``MIG-GPU-<uuid>/<gi>/<ci>`` forms). Commas, ``=`` and
# whitespace would break the ``<dev>=<limit>`` list and the control command's arguments.
_DEVICE_REF = re.compile(r"(?:\d+|(?:GPU|MIG)-[0-9A-Za-z/-]+)")


def client_environment(
    request: MpsRequest, *, device: str | int, pipe_directory: str | None = None
) -> dict[str, str]:
    """The environment variables that hold a client to its request.

    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` uses the ``CUDA_VISIBLE_DEVICES`` device syntax with
    ``=<limit>`` (``0=1024M``, ``MIG-<uuid>=1024M``); it and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
    can only lower the daemon's limits. The device is named as the client's process sees it: under
    MIG the client's ``CUDA_VISIBLE_DEVICES`` is the MIG UUID, so name it by that UUID (or ``0``).

    Args:
        request: a valid client request.
        device: the device ordinal, or a ``GPU-`` / ``MIG-`` UUID.
        pipe_directory: the daemon's ``CUDA_MPS_PIPE_DIRECTORY``, needed when it is not the default
            ``/tmp/nvidia-mps`` (always so under MIG, where each instance runs its own daemon).

    Returns:
        ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, plus ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` when
        ``max_compute_percent`` is set and ``CUDA_MPS_PIPE_DIRECTORY`` when given.

    Raises:
        ValueError: when the request is invalid, the device reference is malformed, or
            ``pipe_directory`` is empty.
    """
    violations = validate_request(request)
    if violations:
        raise ValueError("; ".join(v.message for v in violations))
    ref = _device_ref(device)
    env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{ref}={request.memory_mib}M"}
    if request.max_compute_percent is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(request.max_compute_percent)
    if pipe_directory is not None:
        if not pipe_directory:
            raise ValueError("CUDA_MPS_PIPE_DIRECTORY must not be empty")
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_directory
    return env


def daemon_commands(device_ref: str | int, policy: MpsPolicy) -> tuple[str, ...]:
    """The ``nvidia-cuda-mps-control`` stdin lines that apply a policy to a running daemon.

    The thread percentage is always sent, so a daemon that kept an older value is reset to the
    policy. Both settings are lost on ``quit`` and affect only MPS servers spawned afterwards, so
    send them right after ``nvidia-cuda-mps-control -d``, before any client connects. The policy's
    ``max_clients`` has no control command; Fleet enforces it in :func:`check_fit`.

    Args:
        device_ref: the device ordinal or UUID as the daemon sees it.
        policy: the operator's policy; its ranges are checked, the device-dependent rules are
            :func:`validate_policy`'s.

    Returns:
        ``set_default_active_thread_percentage <pct>``, then
        ``set_default_device_pinned_mem_limit <dev> <N>M`` when a memory limit is set.

    Raises:
        ValueError: when the device reference is malformed or the percentage or memory limit is
            out of range.
    """
    ref = _device_ref(device_ref)
    percent = policy.default_active_thread_percentage
    if not 1 <= percent <= MAX_COMPUTE_PERCENT:
        raise ValueError(f"active thread percentage must be between 1 and 100, got {percent}")
    commands = [f"set_default_active_thread_percentage {percent}"]
    limit = policy.default_pinned_mem_limit_mib
    if limit is not None:
        if limit < 1:
            raise ValueError(f"pinned memory limit must be at least 1 MiB, got {limit}")
        commands.append(f"set_default_device_pinned_mem_limit {ref} {limit}M")
    return tuple(commands)


def _device_ref(device: str | int) -> str:
    ref = str(device)
    if isinstance(device, bool) or not _DEVICE_REF.fullmatch(ref):
        raise ValueError(f"not a device ordinal or GPU-/MIG- UUID: {device!r}")
    return ref
