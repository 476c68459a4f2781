"""The supervisor's reports and events on their way to the control plane, whatever the
transport: a full ``workloads`` report after each ``hello``, then the changes as they happen
(the WebSocket sends them within :data:`COALESCE_S`, many changes in one message; the REST
transport with its next batch).

A report the server refused (its rate limit, say) is not lost: the next one is full, sent after
:data:`RETRY_AFTER_S`. And a full report goes every :data:`FULL_EVERY_S` anyway, so the control
plane's view heals from any message lost on the way (a socket that broke mid-send).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from hostagent.protocol import UpMessage
from hostagent.runtime.sync import WorkloadSync

COALESCE_S = 0.1
"""Changes that happen this close together go in one message (a burst of starts is one)."""
RETRY_AFTER_S = 1.0
FULL_EVERY_S = 60.0


class WorkloadChannel:
    """Wakes the agent's loop when the supervisor has something to say (from any thread)."""

    def __init__(
        self, sync: WorkloadSync | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.sync = sync
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due: asyncio.Event | None = None
        self._lock = threading.Lock()
        self._full_due = False
        self._last_full = clock()
        self._not_before = 0.0
        if sync is not None:
            sync.supervisor.add_listener(self._wake)

    def bind(self, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        """Deliver wake-ups to ``loop`` (the agent's; tests run several in turn)."""
        with self._lock:
            self._loop, self._due = loop, asyncio.Event()
            return self._due

    def _wake(self) -> None:
        with self._lock:
            loop, due = self._loop, self._due
        if loop is not None and due is not None and not loop.is_closed():
            loop.call_soon_threadsafe(due.set)

    def after_hello(self) -> list[UpMessage]:
        """The full report that follows every ``hello``: now, or (:meth:`pending`) once the
        supervisor has found what already runs here. A full report sent before would omit
        those replicas, and the control plane would release their slices."""
        if self.sync is None:
            return []
        self._full_due = True
        return self.pending()

    def refused(self) -> None:
        """The server refused a report of ours: send everything again, a little later."""
        self._full_due = True
        self._not_before = self._clock() + RETRY_AFTER_S
        self._wake()

    def pending(self) -> list[UpMessage]:
        """Events, the full report when it is due and possible, else the changed replicas
        since the last call."""
        if self.sync is None:
            return []
        supervisor = self.sync.supervisor
        messages: list[UpMessage] = list(supervisor.take_events())
        now = self._clock()
        if now < self._not_before:
            return messages
        if now - self._last_full >= FULL_EVERY_S:
            self._full_due = True
        report = supervisor.take_report(full=self._full_due, once_adopted=True)
        if report is not None and report["full"]:
            self._full_due = False
            self._last_full = now
            # An agent that runs nothing has nothing to say (the swarm's thousands of agents).
            if not (report["workloads"] or supervisor.runtimes):
                return messages
        if report is not None:
            messages.append(report)
        return messages
