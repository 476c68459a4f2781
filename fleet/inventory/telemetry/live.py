"""Live telemetry for the callers outside an agent socket (the REST fallback): their events are
merged for ``FLEET_LIVE_BATCH_SECONDS`` into one group message inside an ASGI server."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

from fleet.core import events
from fleet.core.events import FLEET_GROUP, publish

logger = logging.getLogger(__name__)


def batch_seconds() -> float:
    return float(getattr(settings, "FLEET_LIVE_BATCH_SECONDS", 0.1))


class LivePublisher:
    """Merges ``live.telemetry`` of many hosts for a short window into one group message.

    Only used from a worker thread of an ASGI server (the home loop runs elsewhere) on a
    cross-process channel layer; the caller hands its event over and returns at once. A merged
    event has the usual shape (``type``, ``host_id``, ``ts``, ``gpus``) plus ``host_ids``;
    ``host_id`` is the host when the window held one host, else 0.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gpus: dict[str, dict[str, Any]] = {}
        self._hosts: list[int] = []
        self._ts = 0.0
        self._armed_at: float | None = None
        self.sent = 0

    def offer(self, host_id: int, ts: float, gpus: dict[str, dict[str, Any]]) -> bool:
        """Queue the event; ``False`` when it must be published directly instead."""

        window = batch_seconds()
        loop = events._home_loop
        if window <= 0 or loop is None or not loop.is_running() or loop.is_closed():
            return False
        try:
            if asyncio.get_running_loop() is loop:
                return False
        except RuntimeError:
            pass
        layer = get_channel_layer()
        if layer is None or isinstance(layer, InMemoryChannelLayer):
            return False
        now = time.monotonic()
        with self._lock:
            self._gpus.update(gpus)
            self._hosts.append(host_id)
            self._ts = max(self._ts, ts)
            # A window armed on a loop that has since gone (tests) is re-armed.
            arm = self._armed_at is None or now - self._armed_at > max(2.0, 20 * window)
            if arm:
                self._armed_at = now
        if arm:
            try:
                loop.call_soon_threadsafe(self._arm, loop, layer, window)
            except RuntimeError:  # the loop closed meanwhile
                with self._lock:
                    self._armed_at = None
                return False
        return True

    def _arm(self, loop: asyncio.AbstractEventLoop, layer: Any, window: float) -> None:
        loop.call_later(window, lambda: loop.create_task(self._flush(layer)))

    def take(self) -> dict[str, Any] | None:
        with self._lock:
            self._armed_at = None
            if not self._hosts:
                return None
            hosts, gpus, ts = self._hosts, self._gpus, self._ts
            self._hosts, self._gpus, self._ts = [], {}, 0.0
        unique = sorted(set(hosts))
        return {
            "type": "live.telemetry",
            "host_id": unique[0] if len(unique) == 1 else 0,
            "host_ids": unique,
            "ts": ts,
            "gpus": gpus,
        }

    async def _flush(self, layer: Any) -> None:

        event = self.take()
        if event is None:
            return
        try:
            await layer.group_send(FLEET_GROUP, event)
            self.sent += 1
        except Exception:
            logger.warning("live telemetry publish failed", exc_info=True)


live_publisher = LivePublisher()


def publish_live(host_id: int, ts: float, gpus: dict[str, dict[str, Any]]) -> None:
    """Send one host's ``live.telemetry`` (merged with others' inside an ASGI server)."""

    if live_publisher.offer(host_id, ts, gpus):
        return
    publish(FLEET_GROUP, "live.telemetry", {"host_id": host_id, "ts": ts, "gpus": gpus})
