"""Channels group names, the typed live events, and the one helper that publishes from sync code.

Two audiences:

* **Agents** listen on ``agent.host.<id>`` for ``agent.desired_state``.
* **Browsers** listen (through their consumer, which coalesces) on :data:`FLEET_GROUP` for
  :class:`TelemetryEvent` (``live.telemetry``: the latest values of one host's GPUs) and
  :class:`ChangedEvent` (``live.changed``: ids of rows that changed; the browser re-reads them
  through the REST API or re-renders the fragment). Each browser socket also listens on its
  user's group (:func:`user_group`) for :class:`UserRevokedEvent` (``user.revoked``: the user
  signed out, was deactivated or lost every role; the socket closes).

Pushed messages are hints that can be lost (channels-redis drops messages to a full channel);
the truth stays in the database and every receiver can re-sync.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any, Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer

logger = logging.getLogger(__name__)

FLEET_GROUP = "fleet.live"

ChangedKind = Literal["host", "gpu", "partition", "deployment", "allocation", "operation", "event"]


class _GpuLiveOptional(TypedDict, total=False):
    ts_ms: (
        int  # the sample's time on the agent, in ms (browsers show the age; benchmarks the latency)
    )


class GpuLive(_GpuLiveOptional):
    """Latest values of one GPU; ``None`` where NVML has no value (never a made-up 0)."""

    utilization_percent: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    temperature_c: float | None
    power_w: float | None
    health: str
    # MIG instances by partition id: utilisation (GPM on Hopper+, else None) and memory used.
    partitions: dict[str, dict[str, float | None]]


class _TelemetryEventOptional(TypedDict, total=False):
    host_ids: list[int]  # a batch of several hosts' ticks (then ``host_id`` is 0)


class TelemetryEvent(_TelemetryEventOptional):
    type: Literal["live.telemetry"]
    host_id: int
    ts: float
    gpus: dict[str, GpuLive]  # keyed by str(gpu id)


class ChangedEvent(TypedDict):
    type: Literal["live.changed"]
    kind: ChangedKind
    ids: list[int]


class UserRevokedEvent(TypedDict):
    type: Literal["user.revoked"]
    code: int  # the WebSocket close code: CLOSE_SIGNED_OUT or CLOSE_NO_ROLE
    session: str  # session_fingerprint() of the session that ended; "" for every session


# WebSocket close codes a browser understands (static/web/core.js): sign in again / no access.
CLOSE_SIGNED_OUT = 4401
CLOSE_NO_ROLE = 4403


def agent_group(host_id: int) -> str:
    return f"agent.host.{host_id}"


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


def session_fingerprint(session_key: str) -> str:
    """Names a session in channel messages without sending its key (a bearer secret)."""
    return hashlib.sha256(session_key.encode("utf-8")).hexdigest()[:32]


_home_loop: asyncio.AbstractEventLoop | None = None


def register_home_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Remember the ASGI server's event loop (consumers call this on connect).

    The in-memory channel layer's queues belong to that loop; a plain thread (the embedded
    scheduler) must hand its sends to it rather than run them on a loop of its own.
    """
    global _home_loop
    _home_loop = loop


def _send(layer: Any, group: str, message: dict[str, Any]) -> None:
    loop = _home_loop
    if isinstance(layer, InMemoryChannelLayer) and loop is not None and loop.is_running():
        asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop).result(5)
    else:
        async_to_sync(layer.group_send)(group, message)


def publish(group: str, event_type: str, payload: dict[str, Any]) -> bool:
    """Send ``payload`` to a group (``event_type`` names the consumer handler)."""
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        _send(layer, group, {**payload, "type": event_type})
    except Exception:
        logger.warning("publish to %s failed", group, exc_info=True)
        return False
    return True


def publish_changed(kind: ChangedKind, ids: list[int]) -> None:
    """After commit, tell browsers which rows changed."""
    from django.db import transaction

    if not ids:
        return
    event: ChangedEvent = {"type": "live.changed", "kind": kind, "ids": sorted(set(ids))}
    transaction.on_commit(lambda: publish(FLEET_GROUP, "live.changed", dict(event)))


def publish_user_revoked(user_id: int, code: int, session: str = "") -> bool:
    """Close the user's browser sockets (those of one session when ``session`` is given)."""
    event: UserRevokedEvent = {"type": "user.revoked", "code": code, "session": session}
    return publish(user_group(user_id), "user.revoked", dict(event))
