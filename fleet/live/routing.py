"""WebSocket routes (browser and agent sockets)."""

from __future__ import annotations

from typing import Any

from django.urls import path

from fleet.live.browser import BrowserConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/fleet/", BrowserConsumer.as_asgi()),
]
