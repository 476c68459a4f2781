"""The agent sockets' telemetry batcher: one per ASGI event loop.

A socket hands its telemetry here and goes back to reading at once (no thread hop, no Redis
round trip per message). Every :func:`window_seconds` (default 0.1 s) the ticks gathered from
all sockets of the process go to a worker thread as one batch (:mod:`fleet.agents.ingest`):

* the batch is mapped to GPUs (:func:`~fleet.agents.ingest.prepare`) and one
  ``live.telemetry`` group message carries every GPU of it to the browsers;
* then it is stored (:func:`~fleet.agents.ingest.persist`), and hosts whose agent is behind
  the desired generation (and whose redelivery backoff is over) are re-synced through their
  own socket (heartbeats double as re-sync, as before).

Batches never overlap: while one is being stored the next one gathers, so under load batches
grow and the cost per tick falls. One host's tick that cannot be mapped or stored is dropped
alone (:mod:`fleet.agents.ingest`); the hosts' ``last_seen_at`` is written before the hot
store is, so a Redis outage loses points, never heartbeats. A batch that fails whole (the
database down) is logged and dropped: telemetry is a stream, the next tick carries the same
values.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from fleet.agents.ingest import Ingested, Prepared, Tick, persist, prepare
from fleet.core.events import FLEET_GROUP
from fleet.inventory import refusals
from fleet.partitioning.delivery import hosts_to_redeliver
from hostagent import protocol

logger = logging.getLogger(__name__)

Resync = Callable[[], None]

# Ticks a process holds while storing is stuck (database or Redis hanging): about a minute of a
# thousand hosts. Beyond it the oldest half is dropped: memory stays bounded, and the newest
# values, the ones browsers want, are kept.
MAX_PENDING = 60_000


def window_seconds() -> float:
    return float(getattr(settings, "FLEET_LIVE_BATCH_SECONDS", 0.1))


def _persist(prepared: Prepared) -> list[int]:
    """In a worker thread: store the batch, and find the hosts to re-sync."""
    persist(prepared)
    if refusals.pending():
        refusals.flush()
    ids = prepared.done.host_ids
    return hosts_to_redeliver(hosts=ids) if ids else []


class Batcher:
    """Gathers ticks on one event loop and stores them a batch at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: list[Tick] = []
        self.resync: dict[int, Resync] = {}
        self.task: asyncio.Task[None] | None = None
        self.batches = 0
        self.ticks = 0
        self.dropped = 0

    def submit(
        self, host_id: int, host_created: float, telemetry: protocol.Telemetry, resync: Resync
    ) -> None:
        """Queue one host's tick (call on the loop; returns at once)."""
        if len(self.pending) >= MAX_PENDING:
            oldest = len(self.pending) // 2
            del self.pending[:oldest]
            self.dropped += oldest
            logger.warning("telemetry is not being stored: dropped the %d oldest ticks", oldest)
        self.pending.append(Tick(host_id, host_created, time.time(), telemetry))
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
        window = window_seconds()
        started = time.monotonic()
        while self.pending:
            # A window counts from the previous batch's start: storing it took part of this one.
            wait = window - (time.monotonic() - started)
            if wait > 0:
                await asyncio.sleep(wait)
            started = time.monotonic()
            ticks, self.pending = self.pending, []
            try:
                # Browsers first: the values are sent before they are stored.
                prepared = await database_sync_to_async(prepare, thread_sensitive=False)(ticks)
                done = prepared.done
                if done.live:
                    await self._publish(done)
                published = time.monotonic()
                behind = await database_sync_to_async(_persist, thread_sensitive=False)(prepared)
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

    async def _publish(self, done: Ingested) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        event: dict[str, Any] = {
            "type": "live.telemetry",
            "host_id": done.host_ids[0] if len(done.host_ids) == 1 else 0,
            "host_ids": done.host_ids,
            "ts": done.ts,
            "gpus": done.live,
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
