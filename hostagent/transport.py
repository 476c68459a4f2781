"""The agent's HTTP side of the protocol: URLs derived from the server's base URL, enrolment,
one JSON request, and the reconnect backoff (used by :mod:`hostagent.client`)."""

from __future__ import annotations

import ipaddress
import json
import logging
import random
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from hostagent import protocol
from hostagent.config import AgentState, write_state
from hostagent.protocol import EnrollResponse

logger = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.5
# Full jitter (a delay drawn uniformly below the step) spreads a fleet's reconnects over the whole
# step, so that a server restart is met by a trickle, not a herd that comes back in waves. The cap
# bounds how long a host stays away once the server is back: a server upgrade or a Redis restart
# is over in seconds, and hosts must be ready again within a few seconds of it (nothing moved), so
# the cap stays short. A server past its capacity says itself when to come back
# (``retry_later``), which takes precedence: that, not a long cap, is what spreads a large fleet.
BACKOFF_MAX_S = 4.0
BACKOFF_FLOOR_S = 0.05
HTTP_TIMEOUT_S = 10.0


class EnrollError(RuntimeError):
    """The server refused the enrolment token or could not be reached."""


def server_problem(server: str, *, insecure: bool = False) -> str | None:
    """Why the agent must not talk to ``server``, or ``None``.

    The host token (and the enrolment token) travel in every request: a server URL without TLS
    is refused unless it is on this machine (loopback) or the operator said ``--insecure``.
    """
    parts = urlsplit(server)
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        return f"--server must be an https:// (or wss://) URL, not {server[:200]!r}"
    if parts.scheme in ("https", "wss") or insecure:
        return None
    host = parts.hostname
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    return (
        f"--server {server[:200]} has no TLS: the host token would travel in clear. Use "
        "https://, or --insecure (FLEET_AGENT_INSECURE=1) on a network you trust."
    )


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: urllib would send the host token on to wherever they point
    (another host, or from https to http). The 3xx is an error naming where it pointed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def ws_url(server: str) -> str:
    """``http(s)://host[:port][/prefix]`` → ``ws(s)://host[:port][/prefix]/ws/agent/``."""
    parts = urlsplit(server)
    scheme = {"https": "wss", "http": "ws", "wss": "wss", "ws": "ws"}.get(parts.scheme, "ws")
    path = parts.path.rstrip("/") + protocol.WS_PATH
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def http_url(server: str, path: str) -> str:
    """``server`` + an API path, with ``ws(s)`` turned into ``http(s)``."""
    parts = urlsplit(server)
    scheme = {"wss": "https", "ws": "http"}.get(parts.scheme, parts.scheme or "http")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + path, "", ""))


def backoff_delays(rng: random.Random) -> Callable[[int], float]:
    """Exponential backoff with full jitter: attempt ``n`` waits a uniform draw in
    ``[0, min(cap, min_step * 2**n)]`` (never under :data:`BACKOFF_FLOOR_S`)."""

    def delay(attempt: int) -> float:
        step = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** min(attempt, 16))
        return max(BACKOFF_FLOOR_S, float(step * rng.random()))

    return delay


def retry_after_delay(after_s: float, rng: random.Random) -> float:
    """How long to wait when the server said ``retry_later``: what it asked, plus up to half as
    much again, so that agents told the same time do not all come back in the same instant."""
    after_s = min(max(after_s, 0.0), 600.0)
    return max(BACKOFF_FLOOR_S, after_s * (1.0 + rng.random() / 2))


def http(method: str, url: str, token: str | None, body: Any = None) -> tuple[int, Any]:
    """One JSON request with the host token; ``(status, parsed body or None)``. Raises
    ``urllib.error.URLError`` (``HTTPError`` for a 3xx, which is not followed, or a 4xx/5xx)
    or ``OSError``."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    request.add_header("Accept", "application/json")
    if token is not None:
        request.add_header(protocol.AUTH_HEADER, protocol.auth_header_value(token))
    try:
        with _OPENER.open(request, timeout=HTTP_TIMEOUT_S) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            where = str(exc.headers.get("Location", ""))[:200]
            raise urllib.error.URLError(
                f"the server redirected ({exc.code}) to {where!r}: give the final URL as "
                "--server (redirects are not followed: they would take the token along)"
            ) from exc
        raise


def enroll(server: str, enrollment_token: str, hostname: str, state_file: Path) -> AgentState:
    """Trade a one-time enrolment token for the host token and persist it (mode 0600)."""
    body: protocol.EnrollRequest = {"enrollment_token": enrollment_token, "hostname": hostname}
    try:
        _, answer = http("POST", http_url(server, protocol.ENROLL_PATH), None, body)
        protocol.validate(answer, EnrollResponse)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EnrollError(f"enrolment failed: {exc}") from exc
    response = cast(EnrollResponse, answer)
    state = AgentState(token=response["token"], host_id=str(response["host_id"]))
    write_state(state_file, state)
    logger.info("enrolled as host %s", state.host_id)
    return state
