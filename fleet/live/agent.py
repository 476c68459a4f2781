"""The agent socket: hello, telemetry, events and acks up; desired state down.

Agents authenticate with their host token (``Authorization: Token flh_…``) on connect; every
message is then handled for that host only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from fleet.core.events import agent_group, register_home_loop
from fleet.inventory import agents
from fleet.inventory.models import Host
from fleet.partitioning import delivery
from fleet.partitioning.selectors import host_desired_state
from hostagent import protocol

logger = logging.getLogger(__name__)

# A socket keeps its host row this long between telemetry ticks (generations, last seen).
HOST_REFRESH_SECONDS = 5.0

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
    if kind == "telemetry":
        return handle_telemetry(host, message)  # type: ignore[arg-type]
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


def handle_telemetry(host: Host, message: protocol.Telemetry) -> bool:
    """One telemetry tick for a host row the socket keeps; returns whether to re-sync."""
    agents.agent_telemetry(host=host, telemetry=message)
    # A push can be lost (full channel, worker died): heartbeats double as a re-sync.
    if host.applied_generation >= host.desired_generation:
        return False  # not behind (as of the kept row): skip the query
    return host.pk in delivery.hosts_to_redeliver(hosts=[host.pk])


def desired_document(host_id: int) -> dict[str, Any]:
    """The current desired state, recorded as dispatched, to send on this very socket."""
    document = host_desired_state(Host.objects.get(pk=host_id))
    delivery.desired_state_dispatched(host_id=host_id, generation=document["generation"])
    return dict(document)


class AgentConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    host_id: int | None = None
    received = 0
    _host: Host | None = None
    _host_at = 0.0

    def _kept_host(self) -> Host:
        """The host row, re-read every :data:`HOST_REFRESH_SECONDS` (runs in a worker thread)."""
        now = time.monotonic()
        if self._host is None or now - self._host_at >= HOST_REFRESH_SECONDS:
            assert self.host_id is not None
            self._host, self._host_at = Host.objects.get(pk=self.host_id), now
        return self._host

    async def connect(self) -> None:
        host = await database_sync_to_async(agents.host_authenticate)(_token(self.scope))
        if host is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.host_id = host.pk
        register_home_loop(asyncio.get_running_loop())
        await self.channel_layer.group_add(agent_group(host.pk), self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.host_id is not None:
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
        try:
            if message["type"] == "telemetry":
                # The hot path, once a second per host: no ORM write, no shared DB thread.
                behind = await database_sync_to_async(self._telemetry, thread_sensitive=False)(
                    message
                )
            else:
                self._host = None  # anything else may change the host row
                behind = await database_sync_to_async(handle_message)(self.host_id, message)
        except agents.WrongHost as error:
            logger.warning("refused agent for host %s: %s", self.host_id, error.message)
            await self.close(code=CLOSE_WRONG_HOST)
            return
        if behind:
            # Straight down this socket: a group push may be lost (full channel, Redis restart).
            await self.send_json(await database_sync_to_async(desired_document)(self.host_id))

    def _telemetry(self, message: Any) -> bool:
        return handle_telemetry(self._kept_host(), message)

    async def agent_desired_state(self, event: dict[str, Any]) -> None:
        """A push from a worker (through the group): forward it to the agent."""
        await self.send_json(event["message"])
