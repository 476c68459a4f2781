"""MPS daemon health for the collector: checked every few seconds, all daemons at once, off the
event loop.

A check is the k8s device plugin's ``get_default_active_thread_percentage``: one
``nvidia-cuda-mps-control`` process per daemon, with a 5 s timeout. On every tick that is too
much: 8 GPUs x 7 MIG daemons would be 56 fork/execs a second, and one wedged daemon would stall
each tick for 5 s (review D11).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait

from hostagent.logs import FailureLog
from hostagent.mps import MpsManager

MPS_HEALTH_EVERY_S = 10.0
# How long a tick waits for the checks it started; a wedged daemon is collected on a later tick.
MPS_HEALTH_WAIT_S = 0.5
MPS_HEALTH_THREADS = 8


class MpsHealth:
    """MPS daemon health, checked every ``every_s`` in worker threads, all daemons at once.

    :meth:`poll` waits at most ``wait_s``, once per round: a check still running then is
    collected by a later call, so a wedged control daemon costs no tick its heartbeat. Without
    ``threads`` (many simulated agents in one process) the checks run in the caller, in turn.
    """

    def __init__(
        self,
        mps: MpsManager,
        log: FailureLog,
        every_s: float = MPS_HEALTH_EVERY_S,
        *,
        threads: bool = True,
        wait_s: float = MPS_HEALTH_WAIT_S,
    ) -> None:
        self._mps = mps
        self._log = log
        self._every_s = every_s
        self._threads = threads
        self._wait_s = wait_s
        self._pool: ThreadPoolExecutor | None = None
        self._running: dict[str, Future[bool]] = {}
        self._last_start = -math.inf

    def poll(self) -> dict[str, bool]:
        """Health of the daemons whose check finished since the last call, by target; starts
        a round of checks when one is due."""
        now = time.monotonic()
        if now - self._last_start >= self._every_s:
            self._last_start = now
            self._start(self._mps.managed_targets())
            # Only the round just started is waited for: a wedged check is not waited on again.
            wait(list(self._running.values()), timeout=self._wait_s)
        done = {t: f for t, f in self._running.items() if f.done()}
        for target in done:
            del self._running[target]
        return {t: not f.cancelled() and f.result() for t, f in done.items()}

    def recheck(self) -> None:
        """Check at the next poll: an apply just started, restarted or stopped daemons."""
        self._last_start = -math.inf

    def _start(self, targets: list[str]) -> None:
        for target in targets:
            if target not in self._running:
                self._running[target] = self._submit(target)

    def _submit(self, target: str) -> Future[bool]:
        if not self._threads:  # simulated daemons answer at once: no thread is worth it
            done: Future[bool] = Future()
            done.set_result(self._check(target))
            return done
        if self._pool is None:
            self._pool = ThreadPoolExecutor(MPS_HEALTH_THREADS, thread_name_prefix="mps-health")
        return self._pool.submit(self._check, target)

    def _check(self, target: str) -> bool:
        try:
            return self._mps.healthy(target)
        except Exception as exc:  # healthy() answers MpsError itself; anything else is a bug
            self._log.failure(f"checking the MPS daemon of {target}", exc, expected=False)
            return False

    def close(self) -> None:
        """Stop the worker threads (a check already running ends with its own timeout)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
