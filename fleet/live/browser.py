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

The socket also joins its user's group and closes on ``user.revoked``: 4401 when the user
signs out (only that session's sockets), is deactivated or deleted; 4403 when the user loses
every role.

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

from fleet.core.events import (
    CLOSE_NO_ROLE,
    CLOSE_SIGNED_OUT,
    FLEET_GROUP,
    register_home_loop,
    session_fingerprint,
    user_group,
)
from fleet.core.roles import Role, role_of
from fleet.live.base import LoopConsumer

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = CLOSE_SIGNED_OUT
CLOSE_FORBIDDEN = CLOSE_NO_ROLE
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
        self.session = _session_of(self.scope)
        self.flush_task: asyncio.Task[None] | None = None
        # The user's group first, then the role check: a revocation between the two still
        # reaches this socket.
        await self._join(user_group(user.pk))
        role = await database_sync_to_async(role_of)(user)
        if role < Role.VIEWER:
            await self._leave()
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.seq = 0
        self.telemetry: dict[str, dict[str, Any]] = {}
        self.changed: dict[str, set[int]] = {}
        self.fleet_util: dict[str, float | None] = {}
        self.subscribed: set[str] | None = None
        self.last_flush = 0.0
        register_home_loop(asyncio.get_running_loop())
        await self._join(FLEET_GROUP)
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
        await self._leave()

    async def _join(self, group: str) -> None:
        self.groups_joined: list[str] = [*getattr(self, "groups_joined", []), group]
        await self.channel_layer.group_add(group, self.channel_name)

    async def _leave(self) -> None:
        """Stop listening (idempotent: a revoked socket leaves before it closes)."""
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = []
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

    async def user_revoked(self, event: dict[str, Any]) -> None:
        """The user signed out (this session, or every one), was deactivated or lost every role:
        what this socket was allowed to see at connect no longer holds."""
        session = event.get("session")
        if session and session != self.session:
            return  # another session of the same user signed out
        code = event.get("code")
        await self._leave()
        await self.close(
            code=code if code in (CLOSE_SIGNED_OUT, CLOSE_NO_ROLE) else CLOSE_SIGNED_OUT
        )

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


def _session_of(scope: dict[str, Any]) -> str:
    """The fingerprint of the socket's session (Channels' session middleware), or ``""``."""
    key = getattr(scope.get("session"), "session_key", None)
    return session_fingerprint(key) if isinstance(key, str) and key else ""
