"""Which agents are there: heartbeats and socket markers, written a batch a second, ahead of
telemetry.

Every message an agent sends says its host is alive. Sockets note it here (a dictionary write on
the event loop) and one task per process writes every host heard since the last second: one
``UPDATE … WHERE id IN (…)`` for ``last_seen_at`` (:func:`fleet.agents.last_seen.hosts_touch`,
which also brings offline hosts back) and one cache round trip for the socket markers the logs
API reads (:func:`fleet.agents.logs.agent_sockets_open`). It runs on the control threads
(:data:`fleet.live.admission.CONTROL`), never behind telemetry batches or hellos: a server past
its capacity may show coarser telemetry, but no host goes offline because the server was busy.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref

from fleet.agents.last_seen import hosts_touch
from fleet.agents.logs import SOCKET_REFRESH_S, agent_sockets_open
from fleet.live.admission import CONTROL, in_thread

logger = logging.getLogger(__name__)

FLUSH_S = 1.0
NEW_SOCKET_FLUSH_S = 0.05
"""A socket heard for the first time is marked within this (a storm of new sockets still makes
at most a write every this often): the logs API may ask it at once."""


def _write(heard: list[tuple[int, float]], heard_at: float, sockets: dict[int, str]) -> None:
    if heard:
        hosts_touch(heard, heard_at)
    agent_sockets_open(sockets)


class Presence:
    """The hosts heard on one event loop, written every :data:`FLUSH_S`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heard: set[tuple[int, float]] = set()
        self.sockets: dict[int, str] = {}  # host id -> channel of its open socket here
        self.marked: dict[int, float] = {}  # host id -> when its marker was last written
        self.task: asyncio.Task[None] | None = None
        self.flushes = 0

    def seen(self, host_id: int, created: float, channel: str) -> None:
        """A message of the host arrived on ``channel`` (call on the loop; returns at once)."""
        self.heard.add((host_id, created))
        self.sockets[host_id] = channel
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run())

    def gone(self, host_id: int, channel: str) -> None:
        """The socket on ``channel`` closed (a newer one of the host keeps its entry)."""
        if self.sockets.get(host_id) == channel:
            del self.sockets[host_id]
            self.marked.pop(host_id, None)

    async def _run(self) -> None:
        while self.heard:
            new = any(h not in self.marked for h in self.sockets)
            await asyncio.sleep(NEW_SOCKET_FLUSH_S if new else FLUSH_S)
            heard, self.heard = sorted(self.heard), set()
            now = time.monotonic()
            due = {
                h: c
                for h, c in self.sockets.items()
                if now - self.marked.get(h, 0.0) >= SOCKET_REFRESH_S
            }
            try:
                await in_thread(CONTROL, _write)(heard, time.time(), due)
            except Exception as error:  # the database or the cache is down: try next second
                logger.warning("heartbeats of %d hosts not written: %s", len(heard), error)
                self.heard.update(heard)
                continue
            self.flushes += 1
            for host_id in due:
                self.marked[host_id] = now


_presences: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Presence] = (
    weakref.WeakKeyDictionary()
)


def presence() -> Presence:
    """The running loop's presence."""
    loop = asyncio.get_running_loop()
    found = _presences.get(loop)
    if found is None:
        found = _presences[loop] = Presence(loop)
    return found
