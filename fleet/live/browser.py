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
     "fleet": {"utilization_percent": 41.5, "reporting": 996},
     "load": {"level": 0, "name": "normal", "telemetry_interval_s": null}}

``load`` says whether the servers are past their capacity (:mod:`fleet.live.load`): at level 1
("busy") or 2 ("overloaded") telemetry is coarsened (agents report every
``telemetry_interval_s``) and frames come every second, and the page says so. It is the highest
level of this server and of every server whose telemetry reached this socket in the last
:data:`LOAD_REMEMBER_S` seconds.

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

import orjson
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
from fleet.live.load import current_level, levels

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = CLOSE_SIGNED_OUT
CLOSE_FORBIDDEN = CLOSE_NO_ROLE
MAX_SUBSCRIBED = 5000
LOAD_REMEMBER_S = 10.0


class BrowserConsumer(LoopConsumer):
    """One browser tab. Buffers ``live.telemetry`` and ``live.changed`` and flushes them as one
    ``frame`` at most every :attr:`FLUSH_SECONDS` (every second while the server is past its
    capacity)."""

    FLUSH_SECONDS = 0.5
    MAX_FRAME_BYTES = 512 * 1024
    PART_GPUS = 1000  # values of the REST path encoded per this many GPUs
    remote_load: dict[int, float]

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
        if role < Role.MEMBER:
            await self._leave()
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.seq = 0
        self.telemetry: dict[str, dict[str, Any]] = {}
        self.blobs: list[bytes] = []  # JSON objects of GpuLive by GPU id, oldest first
        self.changed: dict[str, set[int]] = {}
        self.fleet_util: dict[str, float | None] = {}
        self.host_util: dict[int, tuple[float, int, int]] = {}
        self.subscribed: set[str] | None = None
        self.remote_load = {}  # load level -> when telemetry last came at that level
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
        """Telemetry of many hosts: pre-encoded by the agent sockets' batcher (``blobs``: JSON
        objects of ``GpuLive`` by GPU id, kept as bytes and never decoded here unless a narrow
        subscription needs a few GPUs of them; ``ids``: their GPU ids; ``fleet``: per host,
        ``[host id, utilisation sum, values, GPUs]``), or a ``gpus`` map (the REST path)."""
        level = event.get("load")
        if isinstance(level, int) and level > 0:
            self.remote_load[level] = time.monotonic()
        blobs, ids = event.get("blobs"), event.get("ids")
        if isinstance(blobs, list) and isinstance(ids, list):
            self._take_blobs(blobs, ids)
            for row in event.get("fleet") or ():
                if isinstance(row, list | tuple) and len(row) == 4:
                    self.host_util[int(row[0])] = (float(row[1]), int(row[2]), int(row[3]))
        gpus = event.get("gpus")
        if isinstance(gpus, dict):
            for gpu_id, values in gpus.items():
                if isinstance(values, dict):
                    key = str(gpu_id)
                    self.telemetry[key] = values
                    util = values.get("utilization_percent")
                    self.fleet_util[key] = util if isinstance(util, int | float) else None
        self._schedule()

    def _take_blobs(self, blobs: list[Any], ids: list[Any]) -> None:
        if self.subscribed is None:
            self.blobs.extend(b for b in blobs if isinstance(b, bytes) and len(b) > 2)
        elif self.subscribed and not self.subscribed.isdisjoint(str(i) for i in ids):
            for blob in blobs:
                if isinstance(blob, bytes):
                    values = orjson.loads(blob)
                    self.telemetry.update((k, v) for k, v in values.items() if k in self.subscribed)

    async def live_changed(self, event: dict[str, Any]) -> None:
        kind, ids = event.get("kind"), event.get("ids")
        if not isinstance(kind, str) or not isinstance(ids, list):
            return
        self.changed.setdefault(kind, set()).update(i for i in ids if isinstance(i, int))
        self._schedule()

    def _schedule(self) -> None:
        if self.flush_task is not None and not self.flush_task.done():
            return
        every = max(self.FLUSH_SECONDS, current_level().browser_flush_s)
        delay = max(0.0, self.last_flush + every - time.monotonic())
        self.flush_task = asyncio.ensure_future(self._flush_after(delay))

    async def _flush_after(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        self.last_flush = time.monotonic()
        telemetry, blobs, changed = self.telemetry, self.blobs, self.changed
        self.telemetry, self.blobs, self.changed = {}, [], {}
        if self.subscribed is not None:
            telemetry = {k: v for k, v in telemetry.items() if k in self.subscribed}
            blobs = []  # a subscription takes the GPUs it wants as they come
        parts = list(blobs)
        items = list(telemetry.items())
        for i in range(0, len(items), self.PART_GPUS):
            parts.append(orjson.dumps(dict(items[i : i + self.PART_GPUS])))
        if parts or changed:
            await self._send_frames(parts, changed)
        self.flush_task = None
        if self.telemetry or self.blobs or self.changed:  # arrived while this frame was sent
            self._schedule()

    async def _send_frames(self, parts: list[bytes], changed: dict[str, set[int]]) -> None:
        """One frame, or several when many GPUs changed (each at most about
        :attr:`MAX_FRAME_BYTES`, with its own ``seq``; ``changed`` rides the first).

        ``parts`` are JSON objects of ``GpuLive`` by GPU id, oldest first; their members are
        spliced into the frame's ``telemetry`` as they are, without decoding them. A GPU in two
        parts of one frame appears twice: JSON parsers keep the last, the newest."""
        fleet = self._fleet_summary()
        load = self._load()
        groups: list[list[bytes]] = [[]]
        size = 0
        for part in parts:
            if groups[-1] and size + len(part) > self.MAX_FRAME_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(part[1:-1])
            size += len(part)
        for n, group in enumerate(groups):
            self.seq += 1
            head = orjson.dumps(
                {
                    "type": "frame",
                    "seq": self.seq,
                    "ts": time.time(),
                    "changed": {kind: sorted(ids) for kind, ids in changed.items()}
                    if n == 0
                    else {},
                    "fleet": fleet,
                    "load": load,
                }
            )
            body = b"".join([head[:-1], b',"telemetry":{', b",".join(group), b"}}"])
            await self.send(text_data=body.decode())

    def _load(self) -> dict[str, Any]:
        now = time.monotonic()
        seen = [n for n, at in self.remote_load.items() if now - at < LOAD_REMEMBER_S]
        level = levels()[min(2, max([current_level().number, *seen]))]
        return {
            "level": level.number,
            "name": level.name,
            "telemetry_interval_s": level.telemetry_interval_s if level.number else None,
        }

    def _fleet_summary(self) -> dict[str, Any]:
        values = [v for v in self.fleet_util.values() if v is not None]
        total, counted = sum(values), len(values)
        reporting = len(self.fleet_util)
        for util_sum, util_n, gpus in self.host_util.values():
            total, counted, reporting = total + util_sum, counted + util_n, reporting + gpus
        mean = round(total / counted, 1) if counted else None
        return {"utilization_percent": mean, "reporting": reporting}


def _session_of(scope: dict[str, Any]) -> str:
    """The fingerprint of the socket's session (Channels' session middleware), or ``""``."""
    key = getattr(scope.get("session"), "session_key", None)
    return session_fingerprint(key) if isinstance(key, str) and key else ""
