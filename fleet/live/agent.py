"""The agent socket: hello, telemetry, events, acks and logs answers up; desired state, logs
requests and pace down.

**Admission** costs O(1) small work on the event loop (:mod:`fleet.live.admission`): the host
token is checked from a short-lived cache or a batched lookup on the control threads, and the
socket is accepted at once, or, past capacity, told when to come back (``retry_later``, then
:data:`~hostagent.protocol.CLOSE_RETRY_LATER`). Joining the host's group, which replaces any
older socket of the host (closed with :data:`~hostagent.protocol.CLOSE_REPLACED`, on any server),
happens right after, off the handshake.

**Messages** are handled for the authenticated host only, and only after
:class:`~fleet.agents.guard.AgentGuard` has checked them (size, shape, clock, rate). Every one of
them is a heartbeat (:mod:`fleet.live.presence`). Telemetry goes straight to the batcher
(:mod:`fleet.live.ingest`); ticks past the telemetry rate, which is what an honest agent's
buffered ticks look like when a busy server reads them late, are coalesced away, never refused
or counted as abuse. Every other message waits in this socket's own queue and is handled in
order, off the event loop: hellos a few at a time per process, acks, events and desired state on
the control threads. So a socket's reading never stops behind its own hello, and one agent's slow
hello never delays another agent's ack or event. A refused message is answered with an ``error``
frame and changes nothing; an agent refused too often is disconnected.

**Load.** The process's load level (:mod:`fleet.live.load`) reaches every agent socket as a
``pace`` message: past capacity, agents report telemetry every 2 s, then 3 s.

**The host token** (:mod:`fleet.live.agent_token`): revoking it (or enrolling again) closes its
sockets at once, and each socket re-checks it every :data:`TOKEN_RECHECK_SECONDS` in case that
message was lost (and right after admission, when it was admitted from the cache); after the
hello, and at each re-check, a token close to its expiry is renewed and the new one sent down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from fleet.agents.delivery import desired_document
from fleet.agents.discovery import WrongHost
from fleet.agents.guard import AgentGuard, Refused
from fleet.agents.logs import agent_socket_closed, logs_answer_store
from fleet.agents.messages import handle_message
from fleet.agents.reports import agent_socket_replaced
from fleet.agents.versions import UnsupportedAgent
from fleet.core.events import agent_group, register_home_loop
from fleet.inventory import refusals
from fleet.live.admission import CONTROL, admission, in_thread
from fleet.live.agent_token import HostTokenConsumer, token_of
from fleet.live.ingest import batcher
from fleet.live.load import Level, monitor
from fleet.live.presence import presence
from hostagent import protocol

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = protocol.CLOSE_REVOKED
CLOSE_WRONG_HOST = 4403
CLOSE_INTERNAL = 1011
# Group membership lives in the channel layer (Redis), which may restart and forget it.
REJOIN_EVERY_MESSAGES = 20
TOKEN_RECHECK_SECONDS = 60.0
# A socket admitted from a cache entry older than this is checked against the database again.
RECHECK_CACHED_AFTER_S = 1.0
# Refusal counts reach the shared store at most this often from one process's sockets.
REFUSALS_FLUSH_SECONDS = 1.0
# Messages other than telemetry waiting in one socket's queue; past it the newest is refused
# as "busy" (an agent sends a few a second; a queue this long means the server is far behind).
CONTROL_QUEUE_MAX = 200
# A database that cannot say whether a token is valid: come back then.
RETRY_WHEN_UNKNOWN_S = 5.0


def _flush_refusals() -> None:
    refusals.flush()


class AgentConsumer(HostTokenConsumer):
    host_created = 0.0
    opened_at = 0.0
    received = 0
    coalesced = 0
    # Its hello spoke a protocol this server does not serve: what follows it is not read (the
    # hello itself is recorded and answered, then the socket closes).
    unsupported = False
    guard: AgentGuard
    _resyncing: asyncio.Task[None] | None = None
    _controller: asyncio.Task[None] | None = None
    _control: asyncio.Queue[protocol.UpMessage]

    async def connect(self) -> None:
        door = admission()
        monitor().start()
        wait = door.come_back_in()
        if wait is not None:
            await self._retry_later(wait, "the server is past its capacity")
            return
        self.token = token_of(self.scope)
        try:
            holder, read_at = await door.authenticate(self.token)
        except Exception as error:  # the database is down: say when to come back
            logger.warning("agent token not checked: %s", error)
            await self._retry_later(RETRY_WHEN_UNKNOWN_S, "the server cannot check tokens now")
            return
        if holder is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.host_id = holder.host_id
        self.host_created = holder.created
        self.token_hash = holder.token_hash
        self._token_facts(holder)
        self.token_checked_at = read_at
        self.guard = AgentGuard()
        self._token_turn = asyncio.Lock()
        self._control = asyncio.Queue(CONTROL_QUEUE_MAX)
        self.opened_at = time.time()
        register_home_loop(asyncio.get_running_loop())
        # Listening for the host's pushes, revocations and replacements from the start (one
        # round trip); telling an older socket of the host to go waits for the control task.
        await self.channel_layer.group_add(agent_group(self.host_id), self.channel_name)
        await self.accept()
        monitor().listen(self)
        if monitor().level.number:
            await self.send_json(monitor().pace_message())
        self._controller = asyncio.ensure_future(
            self._control_loop(recheck=time.monotonic() - read_at > RECHECK_CACHED_AFTER_S)
        )

    async def _retry_later(self, after_s: float, reason: str) -> None:
        await self.accept()
        message: protocol.RetryLater = {
            "type": "retry_later",
            "after_s": round(after_s, 1),
            "reason": reason,
        }
        await self.send_json(message)
        await self.close(code=protocol.CLOSE_RETRY_LATER)

    async def disconnect(self, code: int) -> None:
        if self._controller is not None:
            self._controller.cancel()
        if self.host_id is not None:
            ingest = batcher()
            ingest.forget(self.host_id, self._resync)
            presence().gone(self.host_id, self.channel_name)
            await ingest.drain()  # what this socket sent is stored before it is gone
            await self.channel_layer.group_discard(agent_group(self.host_id), self.channel_name)
            await self._in_cache(agent_socket_closed, self.host_id, self.channel_name)

    # -- up ------------------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        raw = text_data if text_data is not None else bytes_data
        if self.host_id is None or self.closing or self.unsupported or not raw:
            return
        try:
            message = self.guard.admit(raw)
        except Refused as refusal:
            if refusal.reason == "rate_limited" and refusal.refused == "telemetry":
                # Ticks a busy server read late arrive together: the newest stands for them.
                self.coalesced += 1
                return
            await self._refuse(refusal, raw)
            return
        self.received += 1
        if message["type"] == "hello" and protocol.protocol_support(message["protocol"]) != (
            "supported"
        ):
            self.unsupported = True  # the ticks sent right after it must not look alive
        if message["type"] != "hello":
            # A hello marks the host seen once it is accepted (agent_hello): an agent this
            # server refuses (fleet.agents.versions) must not look alive for a moment.
            presence().seen(self.host_id, self.host_created, self.channel_name)
        if self.received % REJOIN_EVERY_MESSAGES == 0:
            await self.channel_layer.group_add(agent_group(self.host_id), self.channel_name)
        if message["type"] == "telemetry":
            # The hot path, once a second per host: queued, stored with other hosts' ticks.
            batcher().submit(self.host_id, self.host_created, message, self._resync)
            return
        try:
            self._control.put_nowait(message)
        except asyncio.QueueFull:
            await self.send_json(
                Refused("busy", "the server is behind: sent again later", message["type"]).frame()
            )

    async def _control_loop(self, *, recheck: bool) -> None:
        """This socket's messages other than telemetry, in order, off the event loop."""
        try:
            await self._join()
            if recheck and not await self._token_still_valid():
                return
            if self.token_replaced:
                await self._retire_replaced_token()
            while self.host_id is not None and not self.closing:
                message = await self._control.get()
                due = time.monotonic() - self.token_checked_at > TOKEN_RECHECK_SECONDS
                if due:
                    if not await self._token_still_valid():
                        return
                    await self._renew_token_if_due()
                await self._handle(message)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("host %s: a message could not be handled", self.host_id)
            self.closing = True
            await self.close(code=CLOSE_INTERNAL)

    async def _join(self) -> None:
        """One live socket per host: whatever older socket of this host is open (on any server)
        goes. Two sockets opened at once both hear each other: the older one goes."""
        assert self.host_id is not None
        await self.channel_layer.group_send(
            agent_group(self.host_id),
            {"type": "agent.replaced", "by": self.channel_name, "at": self.opened_at},
        )

    async def _handle(self, message: protocol.UpMessage) -> None:
        assert self.host_id is not None
        if message["type"] == "logs":
            # Kept for the API view waiting on it (fleet.agents.logs); nothing is written.
            await self._in_cache(logs_answer_store, self.host_id, message)
            return
        try:
            if message["type"] in ("hello", "workloads"):
                # The heavy ones (discovery, workflows waiting on replicas): in the default
                # pool, hellos a few at a time per process.
                turn = (
                    admission().hello_turn()
                    if message["type"] == "hello"
                    else contextlib.nullcontext()
                )
                async with turn:
                    behind = await database_sync_to_async(handle_message, thread_sensitive=False)(
                        self.host_id, message
                    )
            else:
                behind = await in_thread(CONTROL, handle_message)(self.host_id, message)
        except UnsupportedAgent as error:
            # Said before the close, so the agent's log has the sentence, not only a code.
            await self.send_json(
                {"type": "error", "code": error.code, "message": error.message, "refused": "hello"}
            )
            self.closing = True
            await self.close(code=protocol.CLOSE_UNSUPPORTED_PROTOCOL)
            return
        except WrongHost as error:
            logger.warning("refused agent for host %s: %s", self.host_id, error.message)
            self.closing = True
            await self.close(code=CLOSE_WRONG_HOST)
            return
        if message["type"] == "hello" and self.host_id is not None:
            presence().seen(self.host_id, self.host_created, self.channel_name)  # accepted
        if behind:
            await self._send_desired()
        if message["type"] == "hello":
            await self._renew_token_if_due()

    async def _in_cache(self, call: Callable[..., object], *args: Any) -> None:
        """A write of :mod:`fleet.agents.logs` to the cache (Redis may be restarting): a failure
        costs a logs request its answer, never the socket."""
        try:
            await sync_to_async(call, thread_sensitive=False, executor=CONTROL)(*args)
        except Exception as error:
            logger.info("host %s: cache not written (%s)", self.host_id, error)

    async def _refuse(self, refusal: Refused, raw: str | bytes) -> None:
        assert self.host_id is not None
        refusals.refused(self.host_id, refusal.reason, f"{refusal.message}: {raw[:200]!r}")
        _schedule_refusals_flush()
        if self.guard.abusive():
            logger.warning("host %s: too many refused messages, disconnected", self.host_id)
            self.closing = True  # what is still queued on this socket is not read
            await self.close(code=protocol.CLOSE_ABUSE)
            return
        await self.send_json(refusal.frame())

    # -- down ----------------------------------------------------------------------------

    def _resync(self) -> None:
        """The batcher found this agent behind: send it the desired state (once at a time)."""
        if self._resyncing is None or self._resyncing.done():
            self._resyncing = asyncio.ensure_future(self._resync_now())

    async def _resync_now(self) -> None:
        try:
            await self._send_desired()
        except Exception as error:  # the socket closed meanwhile: the next connect re-syncs
            logger.info("re-sync of host %s not sent: %s", self.host_id, error)

    async def _send_desired(self) -> None:
        # Straight down this socket: a group push may be lost (full channel, Redis restart).
        assert self.host_id is not None
        await self.send_json(await in_thread(CONTROL, desired_document)(self.host_id))

    def load_changed(self, level: Level) -> None:
        """The process's load level changed (:mod:`fleet.live.load`): tell the agent its pace."""
        if self.host_id is not None and not self.closing:
            task = asyncio.ensure_future(self._send_quietly(monitor().pace_message()))
            _background.add(task)
            task.add_done_callback(_background.discard)

    async def _send_quietly(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # closed meanwhile: the next socket hears it
            await self.send_json(message)

    async def agent_desired_state(self, event: dict[str, Any]) -> None:
        """A push from a worker (through the group): forward it to the agent."""
        await self.send_json(event["message"])

    async def agent_logs_request(self, event: dict[str, Any]) -> None:
        """The API asks for a replica's output (through the group): forward it to the agent."""
        if self.host_id is not None and not self.closing:
            await self.send_json(event["message"])

    async def agent_replaced(self, event: dict[str, Any]) -> None:
        """Another socket of this host connected: the newer one is the live one."""
        by, at = event.get("by"), event.get("at")
        if self.host_id is None or self.closing or by == self.channel_name:
            return
        if isinstance(at, int | float) and (at, str(by)) < (self.opened_at, self.channel_name):
            return  # that one is older: it goes when it hears this socket's message
        host_id, self.host_id = self.host_id, None  # nothing more is handled on this socket
        if self._controller is not None:
            self._controller.cancel()
        presence().gone(host_id, self.channel_name)
        await self.close(code=protocol.CLOSE_REPLACED)
        await in_thread(CONTROL, agent_socket_replaced)(host_id)
        await self.channel_layer.group_discard(agent_group(host_id), self.channel_name)


_flush_pending = False
_flush_tasks: set[asyncio.Task[None]] = set()
_background: set[asyncio.Future[None]] = set()


def _schedule_refusals_flush() -> None:
    """Refusal counts reach the shared store within a second, in one write per process."""
    global _flush_pending
    if _flush_pending:
        return
    _flush_pending = True
    loop = asyncio.get_running_loop()

    async def flush_later() -> None:
        global _flush_pending
        await asyncio.sleep(REFUSALS_FLUSH_SECONDS)
        _flush_pending = False
        await in_thread(CONTROL, _flush_refusals)()

    task = loop.create_task(flush_later())
    _flush_tasks.add(task)
    task.add_done_callback(_flush_tasks.discard)
