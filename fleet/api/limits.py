"""Request limits: the ASGI body cap and the API throttles.

Every refusal here comes before any work: the body cap before Django spools the body, the
throttles before the body is parsed (DRF checks them right after authentication).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle

from fleet.api.parsers import TOO_LARGE
from fleet.inventory.models import Host

if TYPE_CHECKING:  # rest_framework.views imports this module (DEFAULT_THROTTLE_CLASSES)
    from rest_framework.views import APIView

logger = logging.getLogger(__name__)

_View = TypeVar("_View", bound=Callable[..., Any])

Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# -- the body cap ------------------------------------------------------------------------------


class BodySizeLimit:
    """Refuses an HTTP request whose body passes ``max_bytes`` with a 413 envelope.

    Django's ASGI handler spools any body to a temporary file before a view runs, so the cap has
    to sit in front of it: a declared ``Content-Length`` over the cap is refused before a byte is
    read, and a chunked body stops being read as soon as it passes the cap.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self.max_bytes:
            await self._refuse(send)
            return
        received = 0
        over = started = False

        async def capped_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Django drops a request whose client went away; the 413 is sent below.
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, capped_receive, watched_send)
        if over and not started:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "code": TOO_LARGE,
                "message": f"The request body is larger than {self.max_bytes} bytes.",
                "details": {"max_bytes": self.max_bytes},
            },
            separators=(",", ":"),  # as DRF renders the envelope
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _declared_length(scope: Scope) -> int:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            # bytes.isdigit() is ASCII digits only; a bad value is the server's to refuse.
            return int(value) if value.isdigit() else 0
    return 0


# -- throttles ---------------------------------------------------------------------------------
#
# Three default throttles with disjoint keys (people and API tokens by user, agents by host,
# the rest by client address) and one per-view scope. Agents authenticate as AnonymousUser, so
# DRF's AnonRateThrottle alone would lump every agent behind one NAT address together.


class _FailOpen(SimpleRateThrottle):
    """A throttle that lets requests through while the shared cache (Redis) is unreachable.

    Throttling is a guard, not a dependency: a Redis outage must not turn every API request
    into a 500.
    """

    def allow_request(self, request: Request, view: APIView) -> bool:
        try:
            return super().allow_request(request, view)
        except (RedisError, OSError) as error:
            logger.warning("throttle %s skipped: cache unreachable (%s)", self.scope, error)
            return True


class UserThrottle(_FailOpen, UserRateThrottle):
    """``user`` rate, per signed-in user or API token's user."""

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        if not request.user.is_authenticated:
            return None
        return super().get_cache_key(request, view)


class AgentThrottle(_FailOpen, SimpleRateThrottle):
    """``agent`` rate, per host, for requests made with a host token."""

    scope = "agent"

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        if not isinstance(request.auth, Host):
            return None
        return self.cache_format % {"scope": self.scope, "ident": request.auth.pk}


class AnonThrottle(_FailOpen, AnonRateThrottle):
    """``anon`` rate, per client address (``NUM_PROXIES`` says which address is the client's)."""

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        if isinstance(request.auth, Host):
            return None
        return super().get_cache_key(request, view)


class ScopedThrottle(_FailOpen, SimpleRateThrottle):
    """The rate of the ``@throttle_scope`` of the view or viewset action (``mig``, ``expensive``,
    ``enroll``), per user or address; views without a scope are not limited by it."""

    def __init__(self) -> None:
        """The scope, hence the rate, is known only from the view (see :meth:`allow_request`)."""

    def allow_request(self, request: Request, view: APIView) -> bool:
        self.scope = _scope_of(view)
        if self.scope is None:
            return True
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        user = request.user
        ident = user.pk if user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


def _scope_of(view: APIView) -> str | None:
    action = getattr(view, "action", None)
    handler = getattr(view, action, None) if action else None
    scope = getattr(handler, "throttle_scope", None) or getattr(view, "throttle_scope", None)
    return scope if isinstance(scope, str) else None


def throttle_scope(scope: str) -> Callable[[_View], _View]:
    """Puts a function view (under ``@api_view``) or a viewset action (under ``@action``) in a
    throttle scope of ``DEFAULT_THROTTLE_RATES``."""

    def decorate(view: _View) -> _View:
        view.throttle_scope = scope  # type: ignore[attr-defined]
        return view

    return decorate
