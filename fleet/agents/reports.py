"""What agents report besides discovery: telemetry ticks (the REST fallback's path; sockets
batch theirs, see :mod:`fleet.agents.ingest`), health events, and a socket replaced by another.

Every function takes the ``Host`` its token authenticated; a GPU is only ever looked up within
that host.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from django.utils import timezone

from fleet.agents import ingest
from fleet.core.events import publish_changed
from fleet.core.ratelimit import OncePer, cut
from fleet.inventory.models import Gpu, HealthEvent, HealthEventKind, Host
from fleet.inventory.telemetry import publish_live
from fleet.workflows.health import on_event
from hostagent import protocol

logger = logging.getLogger(__name__)
_warn_once = OncePer(60.0)


def agent_socket_replaced(host_id: int) -> None:
    """A second socket of the host connected and replaced the first: say so in its events (a
    leaked token in use elsewhere shows up here as sockets replacing each other)."""
    HealthEvent.objects.create(
        host_id=host_id,
        kind=HealthEventKind.AGENT_REPLACED,
        detail="a new agent connection replaced the open one",
        ts=timezone.now(),
    )
    publish_changed("host", [host_id])


def agent_telemetry(*, host: Host, telemetry: protocol.Telemetry) -> int:
    """Store one tick (the REST fallback; sockets batch many, see :mod:`fleet.agents.ingest`):
    latest values and a 1 s point per GPU in the telemetry store (Redis, or memory in the
    embedded mode), and a live frame for browsers. No ORM write per tick.

    Returns the number of GPU samples stored."""
    created = host.created_at.timestamp() if host.created_at else 0.0
    done = ingest.ingest([ingest.Tick(host.pk, created, time.time(), telemetry)])
    if done.live:
        publish_live(host.pk, done.ts, done.live)
    return done.samples


def agent_event(*, host: Host, event: protocol.Event) -> HealthEvent | None:
    """Record a health event from the agent. Health decisions act on it (see ``fleet.health``)."""
    gpu = (
        Gpu.objects.filter(host=host, uuid=event["gpu_uuid"]).first() if event["gpu_uuid"] else None
    )
    if event["gpu_uuid"] and gpu is None:
        if _warn_once(host.pk):
            logger.warning(
                "host %s sent an event for unknown GPU %s", host.pk, cut(event["gpu_uuid"])
            )
        return None
    row = HealthEvent.objects.create(
        host=host,
        gpu=gpu,
        kind=event["kind"],
        xid=event["xid"],
        gpu_instance_id=event["gpu_instance_id"],
        detail=event["detail"][:500],
        ts=datetime.fromtimestamp(float(event["ts"]), tz=UTC),
    )
    on_event(row)  # health acts on what agents report
    publish_changed("event", [row.pk])
    if gpu is not None:
        publish_changed("gpu", [gpu.pk])
    return row
