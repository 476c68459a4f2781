"""The browser socket's Origin check: the rule Django's CSRF check applies to unsafe requests.

Channels' ``AllowedHostsOriginValidator`` accepts any Origin whose host is in
``ALLOWED_HOSTS``, and every Origin when that is ``*`` (review, info). A page of another site
could then open a socket with the user's session cookie wherever the browser sends it. This
validator also wants the Origin to be the server's own (the ``Host`` the socket was opened to)
or one of ``CSRF_TRUSTED_ORIGINS`` (behind a proxy that rewrites ``Host``), as Django's CSRF
middleware wants of a form post.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings


def origin_allowed(origin: str, host: str, trusted: list[str] | tuple[str, ...]) -> bool:
    """Whether a socket opened to ``host`` (the ``Host`` header) from a page of ``origin`` may
    go on: the same host and port, or an entry of ``trusted`` (``https://fleet.example``, or
    ``https://*.example.com`` for its subdomains)."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    netloc = parts.netloc.lower()
    if host and netloc == host.lower():
        return True
    for entry in trusted:
        allowed = urlsplit(entry)
        if allowed.scheme != parts.scheme:
            continue
        pattern = allowed.netloc.lower()
        if netloc == pattern:
            return True
        if pattern.startswith("*.") and netloc.endswith(pattern[1:]):
            return True
    return False


class SameOriginValidator:
    """ASGI middleware for browser sockets: refuse (403 at the handshake) an Origin that is
    neither this server's nor trusted."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers") or ())
        origin = headers.get(b"origin", b"").decode("latin-1")
        host = headers.get(b"host", b"").decode("latin-1")
        trusted = list(getattr(settings, "CSRF_TRUSTED_ORIGINS", []))
        if origin_allowed(origin, host, trusted):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
