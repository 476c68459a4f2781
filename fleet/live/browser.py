"""The browsers' live socket (``ws/fleet/``): authenticated, joined to :data:`FLEET_GROUP`, and
coalescing.

However many agents report, a browser receives at most one frame per :attr:`FLUSH_SECONDS`:
telemetry keeps only the latest values per GPU, ``changed`` keeps the union of ids per kind.
A browser may narrow the telemetry it receives to the GPUs it shows (``subscribe``), so a frame
stays small on a fleet of thousands of GPUs. Frames are hints: after a reconnect the ``hello``
frame tells the page to re-read what it shows.

Frames sent::

    {"type": "hello", "seq": 0, "user": "ada", "role": "operator", "flush_ms": 500}
    {"type": "frame", "seq": n, "ts": 1767.2,
     "telemetry": {"<gpu id>": GpuLive, ...},
     "changed": {"gpu": [1, 2], "operation": [9]},
     "fleet": {"utilization_percent": 41.5, "reporting": 996}}

Messages accepted::

    {"type": "subscribe", "gpus": [1, 2, 3]}   # or "gpus": null for every GPU (the default)
    {"type": "ping"}                           # answered by {"type": "pong"}
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels.db import database_sync_to_async

from fleet.core.events import FLEET_GROUP, register_home_loop
from fleet.core.roles import Role, role_of
from fleet.live.base import LoopConsumer

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
MAX_SUBSCRIBED = 5000


class BrowserConsumer(LoopConsumer):
    """One browser tab. Buffers ``live.telemetry`` and ``live.changed`` and flushes them as one
    ``frame`` at most every :attr:`FLUSH_SECONDS`."""

    FLUSH_SECONDS = 0.5
    MAX_FRAME_GPUS = 2000  # about 300 KB of JSON

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()
        if user is None or not getattr(user, "is_authenticated", False):
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        role = await database_sync_to_async(role_of)(user)
        if role < Role.VIEWER:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.seq = 0
        self.telemetry: dict[str, dict[str, Any]] = {}
        self.changed: dict[str, set[int]] = {}
        self.fleet_util: dict[str, float | None] = {}
        self.subscribed: set[str] | None = None
        self.last_flush = 0.0
        self.flush_task: asyncio.Task[None] | None = None
        self.joined = True
        register_home_loop(asyncio.get_running_loop())
        await self.channel_layer.group_add(FLEET_GROUP, self.channel_name)
        await self.send_json(
            {
                "type": "hello",
                "seq": self.seq,
                "user": user.get_username(),
                "role": role.label,
                "flush_ms": int(self.FLUSH_SECONDS * 1000),
            }
        )

    async def disconnect(self, code: int) -> None:
        if getattr(self, "joined", False):
            await self.channel_layer.group_discard(FLEET_GROUP, self.channel_name)
            self.joined = False
        task = getattr(self, "flush_task", None)
        if task is not None and not task.done():
            task.cancel()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            return
        if content.get("type") == "ping":
            await self.send_json({"type": "pong"})
        elif content.get("type") == "subscribe":
            gpus = content.get("gpus")
            if gpus is None:
                self.subscribed = None
            elif isinstance(gpus, list):
                self.subscribed = {str(g) for g in gpus[:MAX_SUBSCRIBED] if isinstance(g, int)}

    async def live_telemetry(self, event: dict[str, Any]) -> None:
        gpus = event.get("gpus")
        if not isinstance(gpus, dict):
            return
        for gpu_id, values in gpus.items():
            if isinstance(values, dict):
                key = str(gpu_id)
                self.telemetry[key] = values
                util = values.get("utilization_percent")
                self.fleet_util[key] = util if isinstance(util, int | float) else None
        self._schedule()

    async def live_changed(self, event: dict[str, Any]) -> None:
        kind, ids = event.get("kind"), event.get("ids")
        if not isinstance(kind, str) or not isinstance(ids, list):
            return
        self.changed.setdefault(kind, set()).update(i for i in ids if isinstance(i, int))
        self._schedule()

    def _schedule(self) -> None:
        if self.flush_task is not None and not self.flush_task.done():
            return
        delay = max(0.0, self.last_flush + self.FLUSH_SECONDS - time.monotonic())
        self.flush_task = asyncio.ensure_future(self._flush_after(delay))

    async def _flush_after(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        self.last_flush = time.monotonic()
        telemetry, changed = self.telemetry, self.changed
        self.telemetry, self.changed = {}, {}
        if self.subscribed is not None:
            telemetry = {k: v for k, v in telemetry.items() if k in self.subscribed}
        if telemetry or changed:
            await self._send_frames(telemetry, changed)
        self.flush_task = None
        if self.telemetry or self.changed:  # arrived while this frame was being sent
            self._schedule()

    async def _send_frames(
        self, telemetry: dict[str, dict[str, Any]], changed: dict[str, set[int]]
    ) -> None:
        """One frame, or several when many GPUs changed: a frame stays well under the 1 MiB a
        WebSocket message may carry (each has its own ``seq``; ``changed`` rides the first)."""
        keys = list(telemetry)
        fleet = self._fleet_summary()
        for start in range(0, max(1, len(keys)), self.MAX_FRAME_GPUS):
            self.seq += 1
            await self.send_json(
                {
                    "type": "frame",
                    "seq": self.seq,
                    "ts": time.time(),
                    "telemetry": {
                        k: telemetry[k] for k in keys[start : start + self.MAX_FRAME_GPUS]
                    },
                    "changed": {kind: sorted(ids) for kind, ids in changed.items()}
                    if start == 0
                    else {},
                    "fleet": fleet,
                }
            )

    def _fleet_summary(self) -> dict[str, Any]:
        values = [v for v in self.fleet_util.values() if v is not None]
        mean = round(sum(values) / len(values), 1) if values else None
        return {"utilization_percent": mean, "reporting": len(self.fleet_util)}
