"""The agent's connection to the control plane: WebSocket with reconnects, or REST polling.

WebSocket (default): connect to ``ws(s)://SERVER/ws/agent/`` with ``Authorization: Token …``,
send ``hello`` (with the applied generation), then telemetry every interval and events as they
come; apply each ``desired_state`` (in a worker thread, one at a time) and answer with ``ack``.
On any disconnect, reconnect with exponential backoff and jitter.

REST fallback (``--transport rest``): every interval ``POST /api/v1/agent/report`` with the
messages gathered since the last report, and ``GET /api/v1/agent/desired-state``; a newer
generation is applied and its ``ack`` goes into the next report.

URL paths live in :mod:`hostagent.protocol` so the server can import the same constants.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from hostagent import protocol
from hostagent.collector import Collector, ticks
from hostagent.config import AgentState, write_state
from hostagent.gpu.backend import GpuBackend
from hostagent.mps import MpsManager
from hostagent.protocol import Ack, DesiredState, EnrollResponse, ProtocolError, UpMessage
from hostagent.reconcile import apply_desired_state, drifted

logger = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
HTTP_TIMEOUT_S = 10.0
# The REST transport checks every this many ticks whether the applied state drifted.
DRIFT_CHECK_TICKS = 10


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


def _http(method: str, url: str, token: str | None, body: Any = None) -> tuple[int, Any]:
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
        _, answer = _http("POST", http_url(server, protocol.ENROLL_PATH), None, body)
        protocol.validate(answer, EnrollResponse)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EnrollError(f"enrolment failed: {exc}") from exc
    response = cast(EnrollResponse, answer)
    state = AgentState(token=response["token"], host_id=str(response["host_id"]))
    write_state(state_file, state)
    logger.info("enrolled as host %s", state.host_id)
    return state


@dataclass
class AgentClient:
    """One agent session loop (WebSocket or REST) for one host."""

    server: str
    state: AgentState
    backend: GpuBackend
    collector: Collector
    mps: MpsManager | None = None
    allow_mutation: bool = False
    interval_s: float = 1.0
    state_file: Path | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        self._apply_lock = asyncio.Lock()
        self._delay = backoff_delays(random.Random(self.seed))
        self.connections = 0

    # -- shared --------------------------------------------------------------------------

    def _persist(self) -> None:
        if self.state_file is not None:
            try:
                write_state(self.state_file, self.state)
            except OSError as exc:
                logger.warning("cannot write %s: %s", self.state_file, exc)

    async def handle_desired_state(self, desired: DesiredState) -> Ack:
        """Apply one desired state (in a thread, serialised) and build its ``ack``."""
        async with self._apply_lock:
            items = await asyncio.to_thread(
                apply_desired_state, self.backend, desired, self.allow_mutation, self.mps
            )
            observed = await asyncio.to_thread(self.collector.gpu_infos)
        if self.allow_mutation:
            self.state = replace(self.state, applied_generation=desired["generation"])
            self._persist()
        logger.info("generation %s: %s", desired["generation"], protocol.ack_status(items))
        return {
            "type": "ack",
            "generation": desired["generation"],
            "status": protocol.ack_status(items),
            "items": items,
            "observed": observed,
        }

    async def _gather(self, tick: int) -> list[UpMessage]:
        async with self._apply_lock:
            messages: list[UpMessage] = [self.collector.telemetry()]
            messages.extend(self.collector.events(0))
        return messages

    # -- WebSocket -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Keep a WebSocket session up until ``stop`` is set."""
        attempt = 0
        while not stop.is_set():
            try:
                async with connect(
                    ws_url(self.server),
                    additional_headers={
                        protocol.AUTH_HEADER: protocol.auth_header_value(self.state.token)
                    },
                    open_timeout=HTTP_TIMEOUT_S,
                ) as ws:
                    self.connections += 1
                    attempt = 0
                    await self._session(ws, stop)
            except InvalidStatus as exc:
                logger.warning("server refused the connection: %s", exc)
            except (OSError, ConnectionClosed, InvalidHandshake, TimeoutError) as exc:
                logger.info("connection lost: %s", exc)
            if stop.is_set():
                break
            delay = self._delay(attempt)
            attempt += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    async def _session(self, ws: ClientConnection, stop: asyncio.Event) -> None:
        hello = await asyncio.to_thread(self.collector.hello, self.state.applied_generation)
        await ws.send(protocol.encode(hello))
        sender = asyncio.create_task(self._send_loop(ws, stop))
        receiver = asyncio.create_task(self._receive_loop(ws))
        stopper = asyncio.create_task(stop.wait())
        done, pending = await asyncio.wait(
            {sender, receiver, stopper}, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if task is not stopper and task.exception() is not None:
                raise cast(BaseException, task.exception())

    async def _send_loop(self, ws: ClientConnection, stop: asyncio.Event) -> None:
        async for tick in ticks(self.interval_s, stop):
            for message in await self._gather(tick):
                await ws.send(protocol.encode(message))

    async def _receive_loop(self, ws: ClientConnection) -> None:
        async for text in ws:
            try:
                message = protocol.decode(text)
            except ProtocolError as exc:
                logger.warning("ignoring a malformed message: %s", exc)
                continue
            if message["type"] == "desired_state":
                ack = await self.handle_desired_state(message)
                await ws.send(protocol.encode(ack))
            elif message["type"] == "ping":
                nonce = message["nonce"]
                pong: protocol.Pong = {"type": "pong", "nonce": nonce, "ts": _now()}
                await ws.send(protocol.encode(pong))
            else:
                logger.warning("unexpected %s message from the server", message["type"])

    # -- REST ----------------------------------------------------------------------------

    async def run_rest(self, stop: asyncio.Event) -> None:
        """Poll ``desired-state`` and post ``report`` batches until ``stop`` is set."""
        outbox: list[UpMessage] = []
        hello_sent = False
        async for tick in ticks(self.interval_s, stop):
            if not hello_sent:
                outbox.append(self.collector.hello(self.state.applied_generation))
            outbox.extend(await self._gather(tick))
            try:
                await asyncio.to_thread(self._post_report, outbox)
                outbox, hello_sent = [], True
                desired = await asyncio.to_thread(self._get_desired)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                logger.warning("REST exchange failed: %s", exc)
                outbox = outbox[-100:]
                continue
            if desired is None:
                continue
            if desired["generation"] > self.state.applied_generation:
                outbox.append(await self.handle_desired_state(desired))
            elif (
                self.allow_mutation
                and tick % DRIFT_CHECK_TICKS == 0
                and await asyncio.to_thread(drifted, self.backend, desired, self.mps)
            ):
                # Same generation, but the GPUs lost what it set up (a reboot): apply it again.
                # (WebSocket agents are re-synced by the server, which sees the drift in hello.)
                logger.warning("generation %s drifted: applying it again", desired["generation"])
                outbox.append(await self.handle_desired_state(desired))

    def _post_report(self, messages: list[UpMessage]) -> None:
        batch: protocol.ReportBatch = {"messages": messages}
        _http("POST", http_url(self.server, protocol.REPORT_PATH), self.state.token, batch)

    def _get_desired(self) -> DesiredState | None:
        url = http_url(self.server, protocol.DESIRED_STATE_PATH)
        status, body = _http("GET", url, self.state.token)
        if status == 204 or body is None:
            return None
        message = protocol.validate_message(body)
        if message["type"] != "desired_state":
            raise ProtocolError("expected a desired_state message")
        return message


def _now() -> float:
    return time.time()
