"""The agent socket: hello, telemetry, events and acks up; desired state down.

Agents authenticate with their host token (``Authorization: Token flh_…``) on connect; every
message is then handled for that host only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.db import database_sync_to_async

from fleet.core.events import agent_group, register_home_loop
from fleet.inventory import agents
from fleet.inventory.models import Host
from fleet.live.base import LoopConsumer
from fleet.live.ingest import batcher
from fleet.partitioning import delivery
from fleet.partitioning.selectors import host_desired_state
from hostagent import protocol

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_WRONG_HOST = 4403
# Group membership lives in the channel layer (Redis), which may restart and forget it.
REJOIN_EVERY_MESSAGES = 20


def _token(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            parts = value.decode("latin-1").split()
            if len(parts) == 2 and parts[0].lower() == protocol.AUTH_SCHEME.lower():
                return str(parts[1])
    return ""


def handle_message(host_id: int, message: protocol.UpMessage) -> bool:
    """Apply one up-message for a host; returns whether the agent must be sent desired state."""
    host = Host.objects.get(pk=host_id)
    kind = message["type"]
    if kind == "hello":
        return agents.agent_hello(host=host, hello=message)  # type: ignore[arg-type]
    if kind == "telemetry":  # sockets batch telemetry (see fleet.live.ingest); kept for callers
        agents.agent_telemetry(host=host, telemetry=message)  # type: ignore[arg-type]
        return False
    if kind == "event":
        agents.agent_event(host=host, event=message)  # type: ignore[arg-type]
    elif kind == "ack":
        delivery.agent_ack(host=host, ack=message)  # type: ignore[arg-type]
        # Something may have changed while the agent was applying: send it if so.
        return Host.objects.filter(pk=host_id).values_list(
            "desired_generation", flat=True
        ).get() > int(
            message["generation"]  # type: ignore[typeddict-item]
        )
    else:
        agents.host_touch(host_id)
    return False


def desired_document(host_id: int) -> dict[str, Any]:
    """The current desired state, recorded as dispatched, to send on this very socket."""
    document = host_desired_state(Host.objects.get(pk=host_id))
    delivery.desired_state_dispatched(host_id=host_id, generation=document["generation"])
    return dict(document)


class AgentConsumer(LoopConsumer):
    host_id: int | None = None
    host_created = 0.0
    received = 0
    _resyncing: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        # A read, off the shared thread: connecting never waits behind other agents' hellos.
        host = await database_sync_to_async(agents.host_authenticate, thread_sensitive=False)(
            _token(self.scope)
        )
        if host is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.host_id = host.pk
        self.host_created = host.created_at.timestamp() if host.created_at else 0.0
        register_home_loop(asyncio.get_running_loop())
        await self.channel_layer.group_add(agent_group(host.pk), self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.host_id is not None:
            ingest = batcher()
            ingest.forget(self.host_id, self._resync)
            await ingest.drain()  # what this socket sent is stored before it is gone
            await self.channel_layer.group_discard(agent_group(self.host_id), self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if self.host_id is None:
            return
        try:
            message = protocol.validate_message(content)
        except protocol.ProtocolError as error:
            logger.warning("host %s sent a malformed message: %s", self.host_id, error)
            return
        if message["type"] in ("desired_state", "ping"):
            return
        self.received += 1
        if self.received % REJOIN_EVERY_MESSAGES == 0:
            await self.channel_layer.group_add(agent_group(self.host_id), self.channel_name)
        if message["type"] == "telemetry":
            # The hot path, once a second per host: queued, stored with other hosts' ticks.
            batcher().submit(self.host_id, self.host_created, message, self._resync)
            return
        try:
            behind = await database_sync_to_async(handle_message)(self.host_id, message)
        except agents.WrongHost as error:
            logger.warning("refused agent for host %s: %s", self.host_id, error.message)
            await self.close(code=CLOSE_WRONG_HOST)
            return
        if behind:
            await self._send_desired()

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
        await self.send_json(await database_sync_to_async(desired_document)(self.host_id))

    async def agent_desired_state(self, event: dict[str, Any]) -> None:
        """A push from a worker (through the group): forward it to the agent."""
        await self.send_json(event["message"])
