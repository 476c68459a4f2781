"""The gateway's activator: where a request goes when its endpoint has no replica in the
rotation (every backend's ``backup`` server, :mod:`fleet.endpoints.haproxy.config`).

A deployment that scales to zero (:mod:`fleet.autoscaling`) answers its first request after a
cold start, not with a refusal. The activator asks ``activate(slot)`` (the deployment gets its
first replica at once; the answer is how long the request may wait, or ``None`` when the
deployment does not scale to zero), then holds the request until HAProxy itself has a copy of
that backend up, and closes the connection without an answer: HAProxy retries the request on the
copy (``retry-on empty-response`` with ``option redispatch``; the request was buffered). Past
the deadline, or when the deployment does not scale to zero, the caller gets a 503 with the
error envelope. The activator is no proxy: no byte of an answer passes through it.
"""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections.abc import Callable

import orjson

from fleet.endpoints.haproxy.config import ACTIVATOR, backend_name
from fleet.endpoints.haproxy.runtime import RuntimeApi, RuntimeApiError, servers_state

logger = logging.getLogger(__name__)

POLL_S = 0.2
REFUSAL_CACHE_S = 1.0
"""A slot whose deployment does not scale to zero is not asked about again for this long: a
flood of requests to an endpoint with no replica costs no database query each."""
MAX_HELD = 512
"""Requests held at once; past it, the next gets 503 (each holds a thread)."""
MAX_BODY_BYTES = 16 * 2**20
Activate = Callable[[int], float | None]


def _error(code: str, message: str) -> bytes:
    return orjson.dumps({"code": code, "message": message, "details": {}})


class Activator:
    """A threaded HTTP listener on loopback (``address`` once started), one thread a request."""

    def __init__(self, api: RuntimeApi, activate: Activate, host: str = "127.0.0.1") -> None:
        self.api = api
        self.activate = activate
        self.held = 0  # requests being held now
        self.released = 0  # requests handed back to HAProxy once a copy was up
        self.refused = 0
        self._refusing: dict[int, float] = {}  # slot -> until when it is refused unasked
        self._lock = threading.Lock()
        activator = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                activator.handle(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _any

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host.decode() if isinstance(host, bytes) else host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="fleet-activator", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(self, request: http.server.BaseHTTPRequestHandler) -> None:
        length = request.headers.get("Content-Length")
        if length and length.isascii() and length.isdigit() and int(length) <= MAX_BODY_BYTES:
            request.rfile.read(int(length))  # read it all: an unread body would reset
        raw = request.headers.get("X-Fleet-Slot", "")
        slot = int(raw) if raw.isdecimal() and len(raw) <= 5 else None
        wait_s = None if slot is None else self._ask(slot)
        if slot is None or wait_s is None or self.held >= MAX_HELD:
            self.refused += 1
            self._answer(
                request,
                _error("endpoint.no_replica", "No replica of this endpoint is ready."),
            )
            return
        with self._lock:
            self.held += 1
        try:
            if self._wait_for_copy(slot, time.monotonic() + wait_s):
                self.released += 1
                request.close_connection = True  # no answer: HAProxy retries on the copy
                return
        finally:
            with self._lock:
                self.held -= 1
        self.refused += 1
        self._answer(
            request,
            _error(
                "endpoint.activation_timeout",
                f"No replica of this endpoint was ready within {wait_s:g} s.",
            ),
        )

    def _ask(self, slot: int) -> float | None:
        if self._refusing.get(slot, 0.0) > time.monotonic():
            return None
        try:
            wait_s = self.activate(slot)
        except Exception:
            logger.exception("activator: activating slot %s failed", slot)
            wait_s = None
        if wait_s is None:
            self._refusing[slot] = time.monotonic() + REFUSAL_CACHE_S
        return wait_s

    def _wait_for_copy(self, slot: int, deadline: float) -> bool:
        backend = backend_name(slot)
        while time.monotonic() < deadline:
            try:
                if any(
                    s.backend == backend
                    and s.name != ACTIVATOR
                    and s.up
                    and not (s.drain or s.maint)
                    for s in servers_state(self.api)
                ):
                    return True
            except RuntimeApiError as exc:
                logger.warning("activator: HAProxy does not answer: %s", exc)
            time.sleep(POLL_S)
        return False

    @staticmethod
    def _answer(request: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        request.send_response(503)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(body)))
        request.send_header("Retry-After", "5")
        request.send_header("Connection", "close")
        request.end_headers()
        request.wfile.write(body)
        request.close_connection = True
