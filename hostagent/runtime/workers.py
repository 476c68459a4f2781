"""A small pool of daemon threads for the supervisor's slow calls (pulls, stops with their grace
period, health checks).

Not ``concurrent.futures``: its threads are joined when the interpreter exits, so an agent
stopped during a 30 s stop or a long pull would hang until it finished. The agent's own stop
must be quick, and the workloads outlive it anyway.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

IDLE_EXIT_S = 30.0


class Workers:
    """Runs submitted calls on up to ``size`` daemon threads (started on demand, ended after
    ``IDLE_EXIT_S`` idle). A call's exception is logged, never raised to anyone."""

    def __init__(self, size: int, name: str = "fleet-workload") -> None:
        self.size = size
        self.name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._waiting = 0
        self._closed = False

    def submit(self, call: Callable[[], None]) -> None:
        """Queue ``call``: an idle thread takes it, else a new one while fewer than ``size``
        run, else the first that becomes free."""
        with self._lock:
            if self._closed:
                return
            if self._waiting > 0:
                self._waiting -= 1
            elif self._threads < self.size:
                self._threads += 1
                name = f"{self.name}-{self._threads}"
                threading.Thread(target=self._run, name=name, daemon=True).start()
            # Queued under the lock: a thread that finds the queue empty under it may end.
            self._queue.put(call)

    def close(self) -> None:
        """Take no more calls; idle threads end (calls in flight finish on their own)."""
        with self._lock:
            self._closed = True
            for _ in range(self._threads):
                self._queue.put(None)

    def _run(self) -> None:
        while True:
            try:
                call = self._queue.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._threads -= 1
                        self._waiting = max(0, self._waiting - 1)
                        return
                continue
            if call is None:
                return
            try:
                call()
            except Exception:  # a bug in one call must not end the worker (review D1)
                logger.exception("a workload operation failed")
            with self._lock:
                self._waiting += 1
