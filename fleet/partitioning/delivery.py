"""Delivery bookkeeping on the host rows: record a generation as dispatched, find the hosts due a
re-push (with backoff), expire operations nobody completed, take quiet hosts offline.

State changes are compare-and-set on the host's generation counters, so duplicate or late acks
and racing workers are harmless. Pushing and acknowledging are the agents app's
(:mod:`fleet.agents.delivery`).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from fleet.core import alerts
from fleet.core.alerts import alert_operation_ended
from fleet.core.events import publish_changed
from fleet.core.models import Operation, OperationStatus
from fleet.inventory.models import Host, HostStatus

logger = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 60.0


def desired_state_dispatched(*, host_id: int, generation: int) -> None:
    """Record that ``generation`` went out; its pending operations become dispatched."""
    now = timezone.now()
    Host.objects.filter(pk=host_id, dispatched_generation__lte=generation).update(
        dispatched_generation=generation,
        dispatched_at=now,
        dispatch_attempts=F("dispatch_attempts") + 1,
    )
    dispatched = Operation.objects.filter(
        host_id=host_id, status=OperationStatus.PENDING, generation__lte=generation
    )
    ids = list(dispatched.values_list("pk", flat=True))
    dispatched.update(status=OperationStatus.DISPATCHED, dispatched_at=now)
    publish_changed("operation", ids)


def backoff_seconds(attempts: int) -> float:
    """Re-push delay after ``attempts`` pushes: base, 2x, 4x, ... capped at a minute."""
    base = float(settings.FLEET_PUSH_RETRY_SECONDS)
    delay: float = base * 2.0 ** max(0, attempts - 1)
    return min(MAX_BACKOFF_SECONDS, delay)


def hosts_to_redeliver(now: Any = None, hosts: list[int] | None = None) -> list[int]:
    """Hosts whose agent has not acknowledged the current generation and whose backoff is over."""
    now = now or timezone.now()
    due = []
    behind = Host.objects.filter(applied_generation__lt=F("desired_generation"))
    if hosts is not None:
        behind = behind.filter(pk__in=hosts)
    behind = behind.exclude(status=HostStatus.OFFLINE)
    for host in behind.only(
        "pk", "dispatched_at", "dispatch_attempts", "dispatched_generation", "desired_generation"
    ):
        stale = host.dispatched_generation < host.desired_generation
        never_sent = stale or host.dispatched_at is None
        if never_sent or _waited(now, host.dispatched_at, host.dispatch_attempts):
            due.append(host.pk)
    return due


def _waited(now: Any, since: Any, attempts: int) -> bool:
    return bool((now - since).total_seconds() >= backoff_seconds(attempts))


def operations_expire(now: Any = None) -> list[int]:
    """Expire operations an agent never completed, with a reason a person can act on."""
    now = now or timezone.now()
    deadline = now - timedelta(seconds=float(settings.FLEET_OPERATION_TIMEOUT_SECONDS))
    stuck = Operation.objects.filter(
        status__in=[OperationStatus.PENDING, OperationStatus.DISPATCHED],
        created_at__lt=deadline,
        # Only an operation that waits for an agent's ack carries the host's generation;
        # long-running workflows (moves, drains, repacks...) keep their own deadlines.
        generation__isnull=False,
    ).select_related("host")
    expired = []
    for operation in stuck:
        host = operation.host
        where = "the host"
        if host is not None:
            seen = f"{host.last_seen_at:%Y-%m-%d %H:%M:%S}" if host.last_seen_at else "never"
            where = f"host {host.name} ({host.status}, last seen {seen})"
        reason = (
            f"Not acknowledged within {int(settings.FLEET_OPERATION_TIMEOUT_SECONDS)} s: "
            f"{where} has not applied generation {operation.generation}."
        )
        changed = Operation.objects.filter(pk=operation.pk, status=operation.status).update(
            status=OperationStatus.EXPIRED, reason=reason, finished_at=now
        )
        if changed:
            expired.append(operation.pk)
            alert_operation_ended(operation, status=OperationStatus.EXPIRED, reason=reason)
    publish_changed("operation", expired)
    return expired


def hosts_mark_offline(now: Any = None) -> list[int]:
    """Hosts whose agent missed the configured number of heartbeats go offline, and remember
    since when (their replicas stay put for a grace period: :mod:`fleet.workflows.offline`).

    A host back from offline (any agent message brings it back) forgets when it went quiet.
    """
    now = now or timezone.now()
    limit = float(settings.FLEET_HEARTBEAT_SECONDS) * int(settings.FLEET_OFFLINE_AFTER_MISSED)
    # Only ready hosts go offline: a cordoned or draining host keeps the operator's state.
    stale = Host.objects.filter(status=HostStatus.READY).filter(
        Q(last_seen_at__lt=now - timedelta(seconds=limit))
        | Q(last_seen_at__isnull=True, token_hash__gt="")
    )
    ids = list(stale.values_list("pk", flat=True))
    # The same filter again in the UPDATE (compare-and-set): a hello in between keeps it ready.
    stale.filter(pk__in=ids).update(status=HostStatus.OFFLINE, offline_since=now)
    if ids:
        names = Host.objects.filter(pk__in=ids).values_list("pk", "name")
        alerts.alert_emit_each(
            event=alerts.HOST_OFFLINE,
            items=[
                (
                    f"Host {n} is offline: no agent message for {int(limit)} s",
                    {"host": {"id": pk, "name": n}},
                )
                for pk, n in names
            ],
        )
    Host.objects.exclude(status=HostStatus.OFFLINE).filter(offline_since__isnull=False).update(
        offline_since=None
    )
    publish_changed("host", ids)
    return ids
