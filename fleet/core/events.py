"""Channels group names and the one helper that publishes to a group from sync code."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


def agent_group(host_id: int) -> str:
    return f"agent.host.{host_id}"


FLEET_GROUP = "fleet.live"


def publish(group: str, event_type: str, payload: dict[str, Any]) -> bool:
    """Send ``payload`` to a group. Pushed messages are hints: the truth stays in the database.

    channels-redis drops a message to a full channel silently, so callers never rely on
    delivery; they record what they sent and let the receiver re-sync.
    """
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        async_to_sync(layer.group_send)(group, {"type": event_type, **payload})
    except Exception:
        logger.warning("publish to %s failed", group, exc_info=True)
        return False
    return True
