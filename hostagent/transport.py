"""The agent's HTTP side of the protocol: URLs derived from the server's base URL, enrolment,
one JSON request, and the reconnect backoff (used by :mod:`hostagent.client`)."""

from __future__ import annotations

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
# A server upgrade or a Redis restart is over in tens of seconds: agents must be back within a few
# seconds of it (hosts ready, nothing moved), not 30 s later. The jitter (50-100 % of the step)
# still spreads a fleet's reconnects over 2 s at this cap, so they do not arrive as one herd.
BACKOFF_MAX_S = 4.0
HTTP_TIMEOUT_S = 10.0


class EnrollError(RuntimeError):
    """The server refused the enrolment token or could not be reached."""


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
    """Exponential backoff with full jitter between 50 % and 100 % of the step."""

    def delay(attempt: int) -> float:
        step = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** min(attempt, 16))
        return float(step * (0.5 + rng.random() / 2))

    return delay


def http(method: str, url: str, token: str | None, body: Any = None) -> tuple[int, Any]:
    """One JSON request with the host token; ``(status, parsed body or None)``. Raises
    ``urllib.error.URLError`` (``HTTPError`` for a 4xx/5xx) or ``OSError``."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    request.add_header("Accept", "application/json")
    if token is not None:
        request.add_header(protocol.AUTH_HEADER, protocol.auth_header_value(token))
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        raw = response.read()
        return response.status, json.loads(raw) if raw else None


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
