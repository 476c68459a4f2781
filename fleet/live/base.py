"""The base of Fleet's socket consumers: messages are dispatched on the event loop, never
through the shared sync thread.

Channels' ``AsyncConsumer.dispatch`` runs ``close_old_connections`` through
``sync_to_async`` before every handler: a hop to the one shared sync thread per message. With a
thousand agents each sending a tick a second, that thread became the bottleneck (and any slow
sync work, such as a storm of agent hellos after a restart, stalled every socket's messages
behind it, browsers included). Fleet's handlers touch the database only through
``database_sync_to_async``, which closes stale connections in its own thread, around each call,
so the per-message hop does nothing for them and is skipped here.

JSON goes through orjson (frames of thousands of GPUs), and a message that is not JSON, or is
over :attr:`LoopConsumer.MAX_MESSAGE_BYTES`, is logged and ignored instead of closing the
socket. (The agent socket reads its messages itself: :mod:`fleet.agents.guard`.)
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer

logger = logging.getLogger(__name__)


class LoopConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    # What a client may send in one message; bigger ones are ignored unread. The server's own
    # frame limit (daphne: 1 MiB, ``--websocket-max-message-size``) applies first.
    MAX_MESSAGE_BYTES = 64 * 1024

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        raw = text_data if text_data is not None else bytes_data
        if not raw:
            raise ValueError("No text section for incoming WebSocket frame!")
        if len(raw) > self.MAX_MESSAGE_BYTES:
            logger.warning("%s: a message of %d bytes was ignored", self.scope["path"], len(raw))
            return
        try:
            content = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            logger.warning(
                "%s: a message that is not JSON was ignored: %s", self.scope["path"], error
            )
            return
        await self.receive_json(content)

    @classmethod
    async def decode_json(cls, text_data: str | bytes) -> Any:
        return orjson.loads(text_data)

    @classmethod
    async def encode_json(cls, content: Any) -> str:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS).decode()
