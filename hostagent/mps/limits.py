"""MPS limits, and which ones a control daemon must hold for the shares placed on it.

Where a limit is enforced (MPS v2 interface, ``mpsv2-interface.html``; the environment
variables appendix, ``appendix-environment-variables.html``):

* a **server's** limits (``set_active_thread_percentage <server PID>``,
  ``set_device_pinned_mem_limit <server PID> <dev> <value>``, or the daemon's defaults at the
  moment the server spawned) bind every client of that server;
* a **client's** ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  "will only further constrain" them: a workload that re-exports them higher gets the server's.

Legacy MPS runs one server per daemon at a time, for one UID: a client of another UID waits
until the running server's clients are gone (``nvidia-cuda-mps-control(1)``). Every share that
runs at the same time on one daemon is therefore a client of the same server, under the same
server limits. So the daemon holds the **largest** of its shares' limits (:func:`daemon_limits`):
a share alone on its daemon, or beside shares that ask the same, is held to its own limits by
the daemon; a share beside larger ones is held to its own only by its environment, and to the
largest by the daemon (:func:`enforced_by_daemon` says which).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_THREAD_PERCENTAGE = 100
"""MPS's own default active thread percentage (``get_default_active_thread_percentage``)."""


@dataclass(frozen=True)
class MpsLimits:
    """Daemon-wide defaults, or one share's limits; ``None`` leaves the MPS default (100 %, no
    memory limit)."""

    active_thread_percentage: int | None = None
    pinned_mem_limit_mib: int | None = None

    def normalized(self) -> MpsLimits:
        """The same limits with MPS's defaults spelled out (``None`` % is 100 %)."""
        percent = self.active_thread_percentage
        return MpsLimits(
            DEFAULT_THREAD_PERCENTAGE if percent is None else percent, self.pinned_mem_limit_mib
        )


def _lower(a: int | None, b: int | None) -> int | None:
    """The tighter of two limits (``None``: no limit)."""
    if a is None:
        return b
    return a if b is None else min(a, b)


def share_limits(setting: MpsLimits, share: MpsLimits) -> MpsLimits:
    """What one share may use on a daemon whose operator setting is ``setting``: its own
    limits, never above the setting (a share without a compute cap gets the setting's)."""
    base = setting.normalized()
    return MpsLimits(
        _lower(base.active_thread_percentage, share.active_thread_percentage),
        _lower(base.pinned_mem_limit_mib, share.pinned_mem_limit_mib),
    ).normalized()


def daemon_limits(
    setting: MpsLimits, shares: Sequence[MpsLimits], running: MpsLimits | None = None
) -> MpsLimits:
    """The limits a daemon must hold (defaults, and per server) for ``shares``.

    Args:
        setting: the operator's MPS setting for the daemon (the GPU's or the instance's).
        shares: the limits of the shares placed on the daemon (memory, compute cap).
        running: what the daemon holds now, if it runs.

    Returns:
        With shares, the largest share's compute and the largest share's memory (no memory
        limit if one share has none), never above ``setting``. Without shares, ``setting``; a
        memory limit the running daemon holds is kept when the setting has none, since MPS has
        no command that clears one under connected clients (a later share sets it again).
    """
    base = setting.normalized()
    if not shares:
        kept = running.pinned_mem_limit_mib if running is not None else None
        memory = base.pinned_mem_limit_mib if base.pinned_mem_limit_mib is not None else kept
        return MpsLimits(base.active_thread_percentage, memory)
    each = [share_limits(setting, s) for s in shares]
    percent = max(s.active_thread_percentage or DEFAULT_THREAD_PERCENTAGE for s in each)
    memories = [s.pinned_mem_limit_mib for s in each]
    memory = None if None in memories else max(m for m in memories if m is not None)
    return MpsLimits(percent, _lower(base.pinned_mem_limit_mib, memory))


def enforced_by_daemon(daemon: MpsLimits, share: MpsLimits, setting: MpsLimits) -> bool:
    """Whether ``daemon``'s limits are exactly the share's own (so its environment cannot
    raise them): else the share's limits below the daemon's are its environment's only."""
    return daemon.normalized() == share_limits(setting, share)
