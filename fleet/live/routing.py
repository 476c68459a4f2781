"""WebSocket routes (browser and agent sockets)."""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from fleet.live.browser import BrowserConsumer
from fleet.live.origin import SameOriginValidator

websocket_urlpatterns: list[Any] = [
    path("ws/fleet/", BrowserConsumer.as_asgi()),
]


def browser_sockets() -> Any:
    """The browser sockets' stack: an Origin whose host is allowed (``ALLOWED_HOSTS``, read
    now) and that is this server's own or trusted, then the session, then the routes."""
    return AllowedHostsOriginValidator(
        SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
    )
