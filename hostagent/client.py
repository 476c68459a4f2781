"""The agent's connection to the control plane: WebSocket with reconnects, or REST polling.

WebSocket (default): connect to ``ws(s)://SERVER/ws/agent/`` with ``Authorization: Token …``,
send ``hello`` (with the applied generation), then telemetry every interval and events as they
come; apply each ``desired_state`` (in a worker thread, one at a time) and answer with ``ack``;
answer each ``logs_request`` with one ``logs`` (read in a worker thread, without holding up the
rest of the session).
On any disconnect, reconnect with exponential backoff and jitter.

REST fallback (``--transport rest``): every interval ``POST /api/v1/agent/report`` with the
messages gathered since the last report, and ``GET /api/v1/agent/desired-state``; a newer
generation is applied and its ``ack`` goes into the next report.

Workloads (:mod:`hostagent.workload_reports`): a full ``workloads`` report follows each
``hello`` (once the supervisor has found what already runs), changes follow as they happen, on
either transport. An agent that has had no desired state since it started fetches one itself
(``GET desired-state``, also over WebSocket): the server pushes only to agents that are behind,
and only a desired state tells which of the workloads found here may be stopped.

Host token renewal: the server sends a ``host_token`` (down the socket, or in the answer to a
REST report) before the current token expires. The agent writes it to its state file at once
(atomically, mode 0600), keeps the connection it has, and presents the new token from its next
connection or request on; a restarted agent reads it from the state file. Should the write
fail, the new token is still used until the agent stops (the server keeps accepting the old one
for a day, and renews again if the agent comes back with it).

URL paths live in :mod:`hostagent.protocol` so the server can import the same constants.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from hostagent import __version__, protocol
from hostagent.collector import Collector, ticks
from hostagent.config import AgentState, write_state
from hostagent.gpu.backend import GpuBackend
from hostagent.logs import FailureLog
from hostagent.mps import MpsManager
from hostagent.protocol import (
    Ack,
    DesiredState,
    ItemResult,
    LogsRequest,
    ProtocolError,
    Telemetry,
    UpMessage,
    clip,
)
from hostagent.reconcile import apply_desired_state, drifted
from hostagent.runtime.sync import WorkloadSync, logs_answer
from hostagent.transport import (
    HTTP_TIMEOUT_S,
    EnrollError,
    backoff_delays,
    enroll,
    http,
    http_url,
    retry_after_delay,
    ws_url,
)
from hostagent.workload_reports import COALESCE_S, RETRY_AFTER_S, WorkloadChannel

__all__ = ["AgentClient", "EnrollError", "enroll", "http_url", "ws_url"]

logger = logging.getLogger(__name__)

# The REST transport checks every this many ticks whether the applied state drifted.
DRIFT_CHECK_TICKS = 10
# The REST transport keeps at most this many messages while the server cannot be reached.
REST_OUTBOX_MAX = 100
# A server that closed with "retry later" without saying when: this long.
RETRY_LATER_DEFAULT_S = 5.0
# A session that lasted this long was a real one: the reconnect backoff starts over after it.
STABLE_SESSION_S = 30.0
# Replicas' outputs read at once for logs requests (each in a worker thread).
LOGS_AT_ONCE = 4
# Logs requests read or waiting at once; past it, a request is answered "busy" at once (a
# server that floods the agent costs it no memory).
LOGS_QUEUED_MAX = 16


class NoRedirectConnect(ws_connect):
    """``websockets``' connect, which follows redirects, to other hosts too; the agent talks to
    the server it was given alone (as its HTTP requests do), so a redirect is an error."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


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
    # False: collect on the event loop. Only for the swarm, whose simulated GPUs answer in
    # microseconds: a worker thread per tick for thousands of agents would cost more than it saves.
    threads: bool = True
    # The workload supervisor (hostagent.runtime); None: this agent knows nothing of workloads.
    workloads: WorkloadSync | None = None

    def __post_init__(self) -> None:
        self._apply_lock = asyncio.Lock()
        self._applying: asyncio.Future[Ack] | None = None
        self._collecting: asyncio.Future[list[UpMessage]] | None = None
        self._log = FailureLog(logger)
        self._rest_hello_due = True
        self._delay = backoff_delays(random.Random(self.seed))
        self._retry_rng = random.Random(None if self.seed is None else self.seed + 1)
        self._channel = WorkloadChannel(self.workloads)
        self._answering: set[asyncio.Task[None]] = set()
        self._logs_slots = asyncio.Semaphore(LOGS_AT_ONCE)
        self._rng = random.Random(self.seed)
        self._retry_after: float | None = None
        # The interval the server asked for while it is past its capacity (``pace``); the
        # agent's own interval when it asked for nothing.
        self._pace_s = self.interval_s
        self.connections = 0
        # What happened to this agent's sockets (the load benchmarks read them): when each one
        # opened, and how many closed with each close code.
        self.connected_at: list[float] = []
        self.closes: dict[int, int] = {}

    # -- shared --------------------------------------------------------------------------

    def _persist(self) -> bool:
        if self.state_file is not None:
            try:
                write_state(self.state_file, self.state)
            except OSError as exc:
                logger.warning("cannot write %s: %s", self.state_file, exc)
                return False
        return True

    def take_token(self, message: protocol.HostToken) -> None:
        """The server renewed the host token: persist it, and present it from the next
        connection (or REST request) on. The current connection goes on as it is."""
        self.state = replace(self.state, token=message["token"])
        expires = time.strftime("%Y-%m-%d %H:%M", time.localtime(message["expires_at"]))
        if self._persist():
            logger.info("host token renewed (valid until %s)", expires)
        else:
            logger.warning(
                "host token renewed (valid until %s) but not saved: a restarted agent would "
                "present the old one, which stops working within a day",
                expires,
            )

    async def handle_desired_state(self, desired: DesiredState) -> Ack:
        """Apply one desired state (in a thread, serialised) and build its ``ack``."""
        async with self._apply_lock:
            return await self._apply_locked(desired)

    async def _apply_locked(self, desired: DesiredState) -> Ack:
        if self._applying is not None:  # one a cancelled session left running
            await asyncio.wait({self._applying})
        # Shielded: a session cancelled by a disconnect or SIGTERM must not orphan the worker
        # thread with the lock released. The next apply would race it, and shutdown would pull
        # NVML from under it (review D17); settle() waits for it instead.
        self._applying = asyncio.ensure_future(self._apply(desired))
        return await asyncio.shield(self._applying)

    async def _apply_for_authority(self, desired: DesiredState | None) -> Ack | None:
        """Apply a desired state the agent fetched itself because none came since it started
        (the server pushes only to agents that are behind): it tells the supervisor which of
        the workloads it found are still wanted. Skipped if a pushed one got there first (it is
        newer or the same)."""
        async with self._apply_lock:
            if self.workloads is None or not self.workloads.needs_authority:
                return None
            if desired is None:  # the host has no desired state at all: nothing is wanted
                await asyncio.to_thread(self.workloads.settle_empty)
                return None
            return await self._apply_locked(desired)

    async def _apply(self, desired: DesiredState) -> Ack:
        generation = desired["generation"]
        self.collector.applying.set()
        try:
            items = await asyncio.to_thread(self._apply_items, desired)
        finally:
            self.collector.applying.clear()
            self.collector.recheck_mps()
        observed = await asyncio.to_thread(self.collector.gpu_infos)
        if self.allow_mutation:
            self.state = replace(self.state, applied_generation=generation)
            self._persist()
        logger.info("generation %s: %s", generation, protocol.ack_status(items))
        return {
            "type": "ack",
            "generation": generation,
            "status": protocol.ack_status(items),
            "items": items,
            "observed": observed,
        }

    def _apply_items(self, desired: DesiredState) -> list[ItemResult]:
        try:
            return apply_desired_state(
                self.backend, desired, self.allow_mutation, self.mps, workloads=self.workloads
            )
        except Exception as exc:  # the driver failed outside one item, or a bug: D1
            logger.exception("generation %s could not be applied", desired["generation"])
            message = clip(f"{type(exc).__name__}: {exc}")
            failed: list[ItemResult] = [
                {
                    "key": f"{gpu}:gpu",
                    "gpu_uuid": gpu,
                    "status": "failed",
                    "message": message,
                    "pids": [],
                }
                for gpu in sorted(desired["gpus"])
            ]
            return failed[: protocol.MAX_ITEMS]

    async def _workload_messages(self, take: Callable[[], list[UpMessage]]) -> list[UpMessage]:
        """The supervisor's messages: read in a thread (it scans ``/proc`` for PIDs), inline
        for the swarm's agents that run nothing (``threads=False``)."""
        if self.threads:
            return await asyncio.to_thread(take)
        return take()

    async def settle(self, timeout_s: float | None) -> bool:
        """Wait (at most ``timeout_s``) for the apply and the collection still running in
        worker threads, if any; True if none is left.

        Called before ``backend.shutdown()``: NVML shut down between "create GPU instance" and
        "create compute instance" leaves MIG half-applied (review D17).
        """
        running = {f for f in (self._applying, self._collecting) if f and not f.done()}
        if running:
            await asyncio.wait(running, timeout=timeout_s)
        return all(f.done() for f in running)

    async def _gather(self, tick: int) -> list[UpMessage]:
        """This tick's messages, collected in a worker thread. Not under the apply lock: the
        heartbeat flows while an apply runs, and NVML and MPS checks never block the loop
        (review D11). A collection slower than one interval (a driver stalled by a GPU falling
        off the bus) is picked up by a later tick; meanwhile ticks send a bare heartbeat."""
        if not self.threads:
            return self._collect_inline()
        if self._collecting is None:
            self._collecting = asyncio.ensure_future(asyncio.to_thread(self.collector.tick))
        done, _ = await asyncio.wait({self._collecting}, timeout=self.interval_s)
        if not done:
            self._log.failure("collecting telemetry", TimeoutError("the GPU driver is slow"))
            return [_heartbeat()]
        collected, self._collecting = self._collecting, None
        try:
            return collected.result()
        except Exception as exc:  # the collector handles its own; this is a bug
            self._log.failure("collecting telemetry", exc, expected=False)
            return [_heartbeat()]

    def _collect_inline(self) -> list[UpMessage]:
        try:
            return self.collector.tick()
        except Exception as exc:  # the collector handles its own; this is a bug
            self._log.failure("collecting telemetry", exc, expected=False)
            return [_heartbeat()]

    # -- WebSocket -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Keep a WebSocket session up until ``stop`` is set.

        Between attempts it waits with exponential backoff and full jitter; a session that
        lasted :data:`STABLE_SESSION_S` starts the backoff over. A server past its capacity
        closes a new socket with :data:`~hostagent.protocol.CLOSE_RETRY_LATER` after a
        ``retry_later`` message: its ``after_s`` (plus jitter) replaces the backoff."""
        attempt = 0
        while not stop.is_set():
            self._retry_after = None
            opened_at: float | None = None
            try:
                async with NoRedirectConnect(
                    ws_url(self.server),
                    additional_headers={
                        protocol.AUTH_HEADER: protocol.auth_header_value(self.state.token)
                    },
                    open_timeout=HTTP_TIMEOUT_S,
                ) as ws:
                    opened_at = time.monotonic()
                    self.connections += 1
                    self.connected_at.append(time.time())
                    self._pace_s = self.interval_s  # a new server has asked for nothing yet
                    try:
                        await self._session(ws, stop)
                    finally:
                        if ws.close_code == protocol.CLOSE_RETRY_LATER:
                            await self._read_retry_later(ws)
                        self._closed(ws.close_code)
            except InvalidStatus as exc:
                logger.warning("server refused the connection: %s", exc)
            except (OSError, ConnectionClosed, InvalidHandshake, TimeoutError) as exc:
                logger.info("connection lost: %s", exc)
            except Exception as exc:  # a bug in one session: reconnect, never end the agent
                self._log.failure("the session", exc, expected=False)
            if stop.is_set():
                break
            if opened_at is not None and time.monotonic() - opened_at >= STABLE_SESSION_S:
                attempt = 0
            if self._retry_after is not None:
                delay = retry_after_delay(self._retry_after, self._retry_rng)
                logger.info("the server is busy: connecting again in %.1f s", delay)
            else:
                delay = self._delay(attempt)
            attempt += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    async def _read_retry_later(self, ws: ClientConnection) -> None:
        """The server closed with :data:`~hostagent.protocol.CLOSE_RETRY_LATER`, perhaps before
        this session read its ``retry_later`` (the hello was still being sent): read it from
        what arrived, or wait :data:`RETRY_LATER_DEFAULT_S`."""
        if self._retry_after is not None:
            return
        self._retry_after = RETRY_LATER_DEFAULT_S
        with contextlib.suppress(Exception):
            for _ in range(8):  # a few frames at most arrive before the close
                message = protocol.decode(await asyncio.wait_for(ws.recv(), 0.1))
                if message["type"] == "retry_later":
                    self._retry_after = message["after_s"]
                    return

    def _closed(self, code: int | None) -> None:
        if code is not None:
            self.closes[code] = self.closes.get(code, 0) + 1
        if code == protocol.CLOSE_ABUSE:
            logger.warning("the server closed the socket as abusive (%s)", code)
        elif code == protocol.CLOSE_UNSUPPORTED_PROTOCOL:
            # Not better in a few seconds: only an upgrade of this agent (or the server) helps.
            self._retry_after = protocol.UNSUPPORTED_RETRY_S
            logger.error(
                "the server does not support this agent's protocol (%s, agent %s): upgrade "
                "the agent (or the server); trying again in %.0f s",
                protocol.PROTOCOL_VERSION,
                __version__,
                protocol.UNSUPPORTED_RETRY_S,
            )

    async def _session(self, ws: ClientConnection, stop: asyncio.Event) -> None:
        hello = await asyncio.to_thread(self.collector.hello, self.state.applied_generation)
        due = self._channel.bind(asyncio.get_running_loop())
        await ws.send(protocol.encode(hello))
        for message in await self._workload_messages(self._channel.after_hello):
            await ws.send(protocol.encode(message))
        sender = asyncio.create_task(self._send_loop(ws, stop))
        receiver = asyncio.create_task(self._receive_loop(ws))
        stopper = asyncio.create_task(stop.wait())
        reporter = asyncio.create_task(self._report_loop(ws, due))
        fetcher = None
        if self.workloads is not None and self.workloads.needs_authority:
            fetcher = asyncio.create_task(self._fetch_authority(ws))
        done, pending = await asyncio.wait(
            {sender, receiver, stopper, reporter}, return_when=asyncio.FIRST_COMPLETED
        )
        if fetcher is not None:
            pending.add(fetcher)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if task is not stopper and task.exception() is not None:
                raise cast(BaseException, task.exception())

    async def _report_loop(self, ws: ClientConnection, due: asyncio.Event) -> None:
        """Workload events and changes, sent as soon as the supervisor has them (those within
        ``COALESCE_S`` in one message), and a full report now and then."""
        while True:
            due.clear()
            for message in await self._workload_messages(self._channel.pending):
                await ws.send(protocol.encode(message))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(due.wait(), timeout=RETRY_AFTER_S)
            await asyncio.sleep(COALESCE_S)

    async def _fetch_authority(self, ws: ClientConnection) -> None:
        """Ask for the desired state once (see :meth:`_apply_for_authority`); a failure waits
        for the next connection, and stops nothing meanwhile."""
        try:
            desired = await asyncio.to_thread(self._get_desired)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self._log.failure("fetching the desired state", exc)
        else:
            ack = await self._apply_for_authority(desired)
            if ack is not None:
                await ws.send(protocol.encode(ack))

    async def _send_loop(self, ws: ClientConnection, stop: asyncio.Event) -> None:
        async for tick in ticks(lambda: self._pace_s, stop):
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
            elif message["type"] == "logs_request":
                self._answer_later(ws, message)
            elif message["type"] == "pace":
                pace = max(self.interval_s, message["interval_s"])
                if pace != self._pace_s:
                    logger.info("telemetry every %.1f s: %s", pace, message["reason"])
                self._pace_s = pace
            elif message["type"] == "retry_later":
                self._retry_after = message["after_s"]
            elif message["type"] == "host_token":
                # On the loop, as every change of self.state is: an apply in flight must not
                # write the old token back.
                self.take_token(message)
            elif message["type"] == "ping":
                nonce = message["nonce"]
                pong: protocol.Pong = {"type": "pong", "nonce": nonce, "ts": _now()}
                await ws.send(protocol.encode(pong))
            elif message["type"] == "error":
                # A message of ours was refused (a bug, or a driver value out of range): the
                # server changed nothing for it. Say so; the next tick carries fresh values.
                logger.warning(
                    "the server refused a %s message: %s %s",
                    message["refused"],
                    message["code"],
                    message["message"],
                )
                if message["refused"] == "workloads":
                    self._channel.refused()  # resent in full: no replica's state is lost
            else:
                logger.warning("unexpected %s message from the server", message["type"])

    def _answer_later(self, ws: ClientConnection, request: LogsRequest) -> None:
        """Answer a ``logs_request`` from a task: the files or Docker are read in a worker
        thread, and the receive loop goes on meanwhile. At most :data:`LOGS_AT_ONCE` are read at
        a time and :data:`LOGS_QUEUED_MAX` held; the server stops waiting after a few seconds
        anyway."""
        busy = len(self._answering) >= LOGS_QUEUED_MAX
        task = asyncio.create_task(
            self._answer_busy(ws, request) if busy else self._answer_logs(ws, request)
        )
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _answer_busy(self, ws: ClientConnection, request: LogsRequest) -> None:
        answer = logs_answer(
            request, [], False, "the agent is answering other logs requests; try again"
        )
        with contextlib.suppress(ConnectionClosed):
            await ws.send(protocol.encode(answer))

    async def _answer_logs(self, ws: ClientConnection, request: LogsRequest) -> None:
        async with self._logs_slots:
            if self.workloads is None:
                answer = logs_answer(request, [], False, "this agent runs no workloads")
            else:
                answer = await asyncio.to_thread(self.workloads.logs, request)
        with contextlib.suppress(ConnectionClosed):
            await ws.send(protocol.encode(answer))

    # -- REST ----------------------------------------------------------------------------

    async def run_rest(self, stop: asyncio.Event) -> None:
        """Poll ``desired-state`` and post ``report`` batches until ``stop`` is set."""
        outbox: list[UpMessage] = []
        self._rest_hello_due = True
        async for tick in ticks(self.interval_s, stop):
            try:
                outbox = await self._rest_tick(tick, outbox)
            except Exception as exc:  # a bug of one tick: the next one tries again (D1)
                self._log.failure("the REST exchange", exc, expected=False)
                outbox = outbox[-REST_OUTBOX_MAX:]

    async def _rest_tick(self, tick: int, outbox: list[UpMessage]) -> list[UpMessage]:
        """One REST exchange; returns what is left to send next time."""
        if self._rest_hello_due:
            hello = await asyncio.to_thread(self.collector.hello, self.state.applied_generation)
            # The new full report makes older workload reports stale: they go.
            older = [m for m in outbox if m["type"] != "workloads"]
            outbox = [hello, *await self._workload_messages(self._channel.after_hello), *older]
        outbox.extend(await self._gather(tick))
        outbox.extend(await self._workload_messages(self._channel.pending))
        try:
            renewed = await asyncio.to_thread(self._post_report, outbox)
            outbox, self._rest_hello_due = [], False
            if renewed is not None:
                self.take_token(renewed)
            desired = await asyncio.to_thread(self._get_desired)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self._log.failure("the REST exchange", exc)
            kept: list[UpMessage] = [m for m in outbox if m["type"] != "hello"]  # hello is redone
            return kept[-REST_OUTBOX_MAX:]
        if desired is None or (
            desired["generation"] <= self.state.applied_generation
            and self.workloads is not None
            and self.workloads.needs_authority
        ):
            ack = await self._apply_for_authority(desired)
            return outbox if ack is None else [*outbox, ack]
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
        return outbox

    def _post_report(self, messages: list[UpMessage]) -> protocol.HostToken | None:
        """Post one report; the renewed host token the answer carries, if any."""
        batch: protocol.ReportBatch = {"messages": messages}
        _, body = http("POST", http_url(self.server, protocol.REPORT_PATH), self.state.token, batch)
        renewed = body.get("host_token") if isinstance(body, dict) else None
        if renewed is None:
            return None
        # The report was taken: a malformed renewal must not have it sent again.
        try:
            message = protocol.validate_message(renewed)
        except ProtocolError as exc:
            logger.warning("ignoring a malformed host_token: %s", exc)
            return None
        return message if message["type"] == "host_token" else None

    def _get_desired(self) -> DesiredState | None:
        url = http_url(self.server, protocol.DESIRED_STATE_PATH)
        status, body = http("GET", url, self.state.token)
        if status == 204 or body is None:
            return None
        message = protocol.validate_message(body)
        if message["type"] != "desired_state":
            raise ProtocolError("expected a desired_state message")
        return message


def _now() -> float:
    return time.time()


def _heartbeat() -> Telemetry:
    """A telemetry message with no GPU values: the host is alive, its driver is not answering."""
    return {"type": "telemetry", "ts": _now(), "gpus": []}
