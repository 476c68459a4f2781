"""The agent socket: hello, telemetry, events, acks and logs answers up; desired state and logs
requests down.

Agents authenticate with their host token (``Authorization: Token flh_…``) on connect; every
message is then handled for that host only, and only after :class:`~fleet.agents.guard.AgentGuard`
has checked it (size, shape, clock, rate): a refused message is answered with an ``error``
frame and changes nothing, and an agent refused too often is disconnected.

A host has one live socket: a new connection replaces the old one (closed with
:data:`~hostagent.protocol.CLOSE_REPLACED`, recorded as an event). Revoking or rotating the host
token closes its sockets at once (``agent.revoke`` through the host's group), and each socket
re-checks its token every :data:`TOKEN_RECHECK_SECONDS` in case that message was lost.

Messages are handled off the event loop in worker threads (``thread_sensitive=False``): one
agent's slow hello never delays another agent's ack or event (they used to share one thread).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from fleet.agents.delivery import desired_document
from fleet.agents.discovery import WrongHost
from fleet.agents.enrollment import host_authenticate, host_token_current
from fleet.agents.guard import AgentGuard, Refused
from fleet.agents.logs import (
    SOCKET_REFRESH_S,
    agent_socket_closed,
    agent_socket_open,
    logs_answer_store,
)
from fleet.agents.messages import handle_message
from fleet.agents.reports import agent_socket_replaced
from fleet.core.events import agent_group, register_home_loop
from fleet.inventory import refusals
from fleet.live.base import LoopConsumer
from fleet.live.ingest import batcher
from hostagent import protocol

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = protocol.CLOSE_REVOKED
CLOSE_WRONG_HOST = 4403
# Group membership lives in the channel layer (Redis), which may restart and forget it.
REJOIN_EVERY_MESSAGES = 20
TOKEN_RECHECK_SECONDS = 60.0
# Refusal counts reach the shared store at most this often from one process's sockets.
REFUSALS_FLUSH_SECONDS = 1.0


def _token(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            parts = value.decode("latin-1").split()
            if len(parts) == 2 and parts[0].lower() == protocol.AUTH_SCHEME.lower():
                return str(parts[1])
    return ""


def _flush_refusals() -> None:
    refusals.flush()


class AgentConsumer(LoopConsumer):
    host_id: int | None = None
    host_created = 0.0
    token_hash = ""
    token_checked_at = 0.0
    received = 0
    marked_at = 0.0
    closing = False
    guard: AgentGuard
    _resyncing: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        # A read, off the shared thread: connecting never waits behind other agents' hellos.
        host = await database_sync_to_async(host_authenticate, thread_sensitive=False)(
            _token(self.scope)
        )
        if host is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.host_id = host.pk
        self.host_created = host.created_at.timestamp() if host.created_at else 0.0
        self.token_hash = host.token_hash
        self.token_checked_at = time.monotonic()
        self.guard = AgentGuard()
        register_home_loop(asyncio.get_running_loop())
        # One live socket per host: whatever socket of this host is open (on any server) goes.
        await self.channel_layer.group_send(
            agent_group(host.pk), {"type": "agent.replaced", "by": self.channel_name}
        )
        await self.channel_layer.group_add(agent_group(host.pk), self.channel_name)
        await self.accept()
        await self._mark_open()

    async def disconnect(self, code: int) -> None:
        if self.host_id is not None:
            ingest = batcher()
            ingest.forget(self.host_id, self._resync)
            await ingest.drain()  # what this socket sent is stored before it is gone
            await self.channel_layer.group_discard(agent_group(self.host_id), self.channel_name)
            await self._in_cache(agent_socket_closed, self.host_id, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        raw = text_data if text_data is not None else bytes_data
        if self.host_id is None or self.closing or not raw:
            return
        try:
            message = self.guard.admit(raw)
        except Refused as refusal:
            await self._refuse(refusal, raw)
            return
        self.received += 1
        if self.received % REJOIN_EVERY_MESSAGES == 0:
            await self.channel_layer.group_add(agent_group(self.host_id), self.channel_name)
        recheck = time.monotonic() - self.token_checked_at > TOKEN_RECHECK_SECONDS
        if recheck and not await self._token_still_valid():
            return
        if time.monotonic() - self.marked_at > SOCKET_REFRESH_S:
            await self._mark_open()
        if message["type"] == "logs":
            # Kept for the API view waiting on it (fleet.agents.logs); nothing is written.
            await self._in_cache(logs_answer_store, self.host_id, message)
            return
        if message["type"] == "telemetry":
            # The hot path, once a second per host: queued, stored with other hosts' ticks.
            batcher().submit(self.host_id, self.host_created, message, self._resync)
            return
        try:
            behind = await database_sync_to_async(handle_message, thread_sensitive=False)(
                self.host_id, message
            )
        except WrongHost as error:
            logger.warning("refused agent for host %s: %s", self.host_id, error.message)
            await self.close(code=CLOSE_WRONG_HOST)
            return
        if behind:
            await self._send_desired()

    async def _mark_open(self) -> None:
        """Tell the API this host has an open socket (logs can be asked for)."""
        assert self.host_id is not None
        self.marked_at = time.monotonic()
        await self._in_cache(agent_socket_open, self.host_id, self.channel_name)

    async def _in_cache(self, call: Callable[..., object], *args: Any) -> None:
        """A write of :mod:`fleet.agents.logs` to the cache (Redis may be restarting): a failure
        costs a logs request its answer, never the socket."""
        try:
            await sync_to_async(call, thread_sensitive=False)(*args)
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

    async def _token_still_valid(self) -> bool:
        assert self.host_id is not None
        self.token_checked_at = time.monotonic()
        valid: bool = await database_sync_to_async(host_token_current, thread_sensitive=False)(
            self.host_id, self.token_hash
        )
        if not valid:
            self.closing = True
            await self.close(code=protocol.CLOSE_REVOKED)
        return valid

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
        await self.send_json(
            await database_sync_to_async(desired_document, thread_sensitive=False)(self.host_id)
        )

    async def agent_desired_state(self, event: dict[str, Any]) -> None:
        """A push from a worker (through the group): forward it to the agent."""
        await self.send_json(event["message"])

    async def agent_logs_request(self, event: dict[str, Any]) -> None:
        """The API asks for a replica's output (through the group): forward it to the agent."""
        if self.host_id is not None and not self.closing:
            await self.send_json(event["message"])

    async def agent_replaced(self, event: dict[str, Any]) -> None:
        """Another socket of this host connected: it is the live one now."""
        if self.host_id is None or self.closing or event.get("by") == self.channel_name:
            return
        host_id, self.host_id = self.host_id, None  # nothing more is handled on this socket
        await self.close(code=protocol.CLOSE_REPLACED)
        await database_sync_to_async(agent_socket_replaced, thread_sensitive=False)(host_id)
        await self.channel_layer.group_discard(agent_group(host_id), self.channel_name)

    async def agent_revoke(self, event: dict[str, Any]) -> None:
        """The host token was revoked or rotated: close unless this socket's token still holds
        (it connected with the new one)."""
        if self.host_id is not None:
            await self._token_still_valid()


_flush_pending = False
_flush_tasks: set[asyncio.Task[None]] = set()


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
        await database_sync_to_async(_flush_refusals, thread_sensitive=False)()

    task = loop.create_task(flush_later())
    _flush_tasks.add(task)
    task.add_done_callback(_flush_tasks.discard)
