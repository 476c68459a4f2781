"""The base of Fleet's socket consumers: messages are dispatched on the event loop, never
through the shared sync thread.

Channels' ``AsyncConsumer.dispatch`` runs ``close_old_connections`` through
``sync_to_async`` before every handler: a hop to the one shared sync thread per message. With a
thousand agents each sending a tick a second, that thread became the bottleneck (and any slow
sync work, such as a storm of agent hellos after a restart, stalled every socket's messages
behind it, browsers included). Fleet's handlers touch the database only through
``database_sync_to_async``, which closes stale connections in its own thread, around each call,
so the per-message hop does nothing for them and is skipped here.
"""

from __future__ import annotations

import json
from typing import Any

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer


class LoopConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    @classmethod
    async def encode_json(cls, content: Any) -> str:
        return json.dumps(content, separators=(",", ":"))
