"""The agent sockets' telemetry batcher: one per ASGI event loop.

A socket hands its telemetry here and goes back to reading at once (no thread hop, no Redis
round trip per message). Every batch window (:mod:`fleet.live.load`: 0.1 s when the process
is calm, up to 1 s past its capacity) the ticks gathered from all sockets of the process go to
the telemetry thread as one batch (:mod:`fleet.agents.ingest`):

* the batch is mapped to GPUs (:func:`~fleet.agents.ingest.prepare`) and one
  ``live.telemetry`` group message carries every GPU of it to the browsers;
* then it is stored (:func:`~fleet.agents.ingest.persist`), and hosts whose agent is behind
  the desired generation (and whose redelivery backoff is over) are re-synced through their
  own socket (heartbeats double as re-sync, as before).

**Bounded by the fleet, not by time.** A batch holds at most one tick per host: a newer tick of
a host replaces the one still waiting (counted in :attr:`Batcher.coalesced`). However far behind
the process falls, what waits is one tick per host, the newest, and its age is the batch's
lag, which the load monitor reads (:meth:`~fleet.live.load.LoadMonitor.backlog`). Batches never
overlap: while one is being stored the next one gathers, so under load batches grow and the
cost per tick falls. One host's tick that cannot be mapped or stored is dropped alone
(:mod:`fleet.agents.ingest`). Heartbeats do not wait for any of this: the sockets write them
ahead of telemetry (:mod:`fleet.live.presence`). A batch that fails whole (the database down)
is logged and dropped: telemetry is a stream, the next tick carries the same values.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

from channels.layers import get_channel_layer

from fleet.agents.ingest import Ingested, Prepared, Tick, live_blobs, persist, prepare
from fleet.core.events import FLEET_GROUP
from fleet.inventory import refusals
from fleet.live.admission import TELEMETRY, in_thread
from fleet.live.load import current_level, monitor
from fleet.partitioning.delivery import hosts_to_redeliver
from hostagent import protocol

logger = logging.getLogger(__name__)

Resync = Callable[[], None]


def window_seconds() -> float:
    """The batch window at the process's current load."""
    return current_level().batch_window_s


# Hosts behind the desired generation are looked for at most this often (one query for every
# host heard since): a re-sync is a safety net under the redelivery backoff, not a hot path.
REDELIVER_CHECK_S = 1.0


def _prepare(ticks: list[Tick]) -> tuple[Prepared, list[bytes], list[int]]:
    """In the telemetry thread: map the batch, and encode its live values once for browsers."""
    prepared = prepare(ticks)
    blobs, ids = live_blobs(prepared.done)
    return prepared, blobs, ids


def _persist(prepared: Prepared, check: list[int]) -> list[int]:
    """In the telemetry thread: store the batch, and find the hosts among ``check`` to re-sync."""
    persist(prepared, touch=False)
    if refusals.pending():
        refusals.flush()
    return hosts_to_redeliver(hosts=check) if check else []


class Batcher:
    """Gathers ticks on one event loop and stores them a batch at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[int, Tick] = {}
        self.resync: dict[int, Resync] = {}
        self.task: asyncio.Task[None] | None = None
        self.batches = 0
        self.ticks = 0
        self.coalesced = 0
        self.heard: set[int] = set()  # hosts heard since the last re-sync check
        self.checked_at = 0.0

    def submit(
        self, host_id: int, host_created: float, telemetry: protocol.Telemetry, resync: Resync
    ) -> None:
        """Queue one host's tick, replacing one of the same host still waiting (call on the
        loop; returns at once)."""
        if self.pending.pop(host_id, None) is not None:
            self.coalesced += 1
        self.pending[host_id] = Tick(host_id, host_created, time.time(), telemetry)
        self.resync[host_id] = resync
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run())

    def forget(self, host_id: int, resync: Resync) -> None:
        """The socket closed: no re-sync through it any more."""
        if self.resync.get(host_id) == resync:  # ==: a bound method is a new object each time
            del self.resync[host_id]

    async def drain(self) -> None:
        """Wait until every tick queued so far is stored (a socket closing waits for its own)."""
        while self.task is not None and not self.task.done():
            await asyncio.shield(self.task)

    async def _run(self) -> None:
        load = monitor()
        load.start()
        started = time.monotonic()
        while self.pending:
            # A window counts from the previous batch's start: storing it took part of this one.
            wait = load.level.batch_window_s - (time.monotonic() - started)
            if wait > 0:
                await asyncio.sleep(wait)
            started = time.monotonic()
            ticks, self.pending = list(self.pending.values()), {}
            load.backlog(time.time() - min(t.received_at for t in ticks))
            try:
                # Browsers first: the values are sent before they are stored.
                prepared, blobs, ids = await in_thread(TELEMETRY, _prepare)(ticks)
                done = prepared.done
                if done.live:
                    await self._publish(done, blobs, ids, load.level.number)
                published = time.monotonic()
                self.heard.update(t.host_id for t in ticks)
                check: list[int] = []
                if published - self.checked_at >= REDELIVER_CHECK_S:
                    check, self.heard, self.checked_at = sorted(self.heard), set(), published
                behind = await in_thread(TELEMETRY, _persist)(prepared, check)
            except Exception:
                logger.warning("dropped a telemetry batch of %d ticks", len(ticks), exc_info=True)
                continue
            self.batches += 1
            self.ticks += len(ticks)
            logger.debug(
                "batch %d: %d ticks, %d GPUs, published after %.0f ms, stored after %.0f ms",
                self.batches,
                len(ticks),
                len(done.live),
                (published - started) * 1000,
                (time.monotonic() - started) * 1000,
            )
            for host_id in behind:
                resync = self.resync.get(host_id)
                if resync is not None:
                    resync()

    async def _publish(
        self, done: Ingested, blobs: list[bytes], ids: list[int], level: int
    ) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        # The values travel pre-encoded (:func:`~fleet.agents.ingest.live_blobs`): every server
        # with browsers receives every batch, and decoding thousands of GPUs' values there
        # (msgpack) cost more than anything else per sample. Browsers splice them as they are.
        event: dict[str, Any] = {
            "type": "live.telemetry",
            "host_id": done.host_ids[0] if len(done.host_ids) == 1 else 0,
            "host_ids": done.host_ids,
            "ts": done.ts,
            "blobs": blobs,
            "ids": ids,
            "fleet": done.hosts_util,
            "load": level,
        }
        try:
            await layer.group_send(FLEET_GROUP, event)
        except Exception:
            logger.warning("live telemetry publish failed", exc_info=True)


_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Batcher] = (
    weakref.WeakKeyDictionary()
)


def batcher() -> Batcher:
    """The running loop's batcher."""
    loop = asyncio.get_running_loop()
    found = _batchers.get(loop)
    if found is None:
        found = _batchers[loop] = Batcher(loop)
    return found
