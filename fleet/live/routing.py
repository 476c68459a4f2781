"""WebSocket routes (browser and agent sockets)."""

from __future__ import annotations

from typing import Any

websocket_urlpatterns: list[Any] = []
