"""Alerts: the events worth telling someone about, queued for each webhook that wants them.

Every floor raises alerts (a GPU gone unhealthy in allocations, a host gone quiet in
partitioning, a host back in agents), so the queue lives on the lowest one and knows rows only
by what the caller passes. :func:`alert_emit` writes one :class:`AlertDelivery` per subscribed
webhook in the caller's transaction (the alert commits with the change, or not at all) and asks
for the sends after commit (``fleet.deliver_alert``: a worker, or this process in the embedded
mode). Sending, signing and retries are in :mod:`fleet.core.webhooks`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any, Literal, TypedDict

from django.db import transaction
from django.utils import timezone

from fleet.core.jobs import enqueue
from fleet.core.models import AlertDelivery, AlertWebhook, OperationStatus

GPU_UNHEALTHY = "gpu.unhealthy"
GPU_RECOVERED = "gpu.recovered"
HOST_OFFLINE = "host.offline"
HOST_BACK = "host.back"
HOSTS_MASS_OFFLINE = "hosts.mass_offline"
# An agent this server does not serve (too old, or newer than the server): fleet.agents.versions.
AGENT_UNSUPPORTED = "agent.unsupported"
OPERATION_FAILED = "operation.failed"
OPERATION_EXPIRED = "operation.expired"
REPLICA_CRASHLOOP = "replica.crashloop"
# A team's quota at 90 % and at 100 %: named here so webhooks can subscribe; raised by the
# quota checks (teams and quotas land separately).
QUOTA_WARNING = "quota.warning"
QUOTA_EXCEEDED = "quota.exceeded"
# A team takes its deserved share back from borrowers (fleet.workflows.reclaim): the plan
# accepted (what moves, what stops) and the reclaim done (what was moved, stopped, placed).
RECLAIM_STARTED = "reclaim.started"
RECLAIM_FINISHED = "reclaim.finished"

EVENTS: tuple[str, ...] = (
    GPU_UNHEALTHY,
    GPU_RECOVERED,
    HOST_OFFLINE,
    HOST_BACK,
    HOSTS_MASS_OFFLINE,
    AGENT_UNSUPPORTED,
    OPERATION_FAILED,
    OPERATION_EXPIRED,
    REPLICA_CRASHLOOP,
    QUOTA_WARNING,
    QUOTA_EXCEEDED,
    RECLAIM_STARTED,
    RECLAIM_FINISHED,
)

Severity = Literal["critical", "warning", "info"]

SEVERITY: dict[str, Severity] = {
    GPU_UNHEALTHY: "critical",
    GPU_RECOVERED: "info",
    HOST_OFFLINE: "warning",
    HOST_BACK: "info",
    HOSTS_MASS_OFFLINE: "critical",
    AGENT_UNSUPPORTED: "warning",
    OPERATION_FAILED: "warning",
    OPERATION_EXPIRED: "warning",
    REPLICA_CRASHLOOP: "warning",
    QUOTA_WARNING: "warning",
    QUOTA_EXCEEDED: "critical",
    RECLAIM_STARTED: "info",
    RECLAIM_FINISHED: "info",
}

# A recovery resolves the alert its problem raised (Alertmanager: the same alert, ``endsAt``).
RESOLVES: dict[str, str] = {GPU_RECOVERED: GPU_UNHEALTHY, HOST_BACK: HOST_OFFLINE}


class AlertPayload(TypedDict):
    """The ``fleet`` format's body (and what every format is rendered from)."""

    id: str  # one per event, the same for every webhook it goes to
    event: str
    state: Literal["firing", "resolved"]
    severity: Severity
    summary: str
    ts: str  # ISO 8601, UTC
    subject: dict[str, Any]  # ids and names of what it is about: gpu, host, operation, ...


def alert_emit(
    *, event: str, summary: str, subject: dict[str, Any], resolved: bool | None = None
) -> list[int]:
    """Queue ``event`` for every enabled webhook subscribed to it; returns the deliveries.

    ``resolved`` defaults to whether the event is a recovery (:data:`RESOLVES`). Costs one query
    when no webhook wants the event.
    """
    return alert_emit_each(event=event, items=[(summary, subject)], resolved=resolved)


def alert_subscribers(event: str) -> list[int]:
    """The enabled webhooks that want ``event`` (one query)."""
    assert event in EVENTS, event
    return [
        pk
        for pk, events in AlertWebhook.objects.filter(enabled=True).values_list("pk", "events")
        if isinstance(events, list) and event in events
    ]


def alert_emit_each(
    *,
    event: str,
    items: Iterable[tuple[str, dict[str, Any]]],
    resolved: bool | None = None,
    hooks: list[int] | None = None,
) -> list[int]:
    """:func:`alert_emit` for several events of one kind (one per host, say): one query for the
    subscribers, one insert. ``hooks``: the subscribers when the caller already asked."""
    hooks = alert_subscribers(event) if hooks is None else hooks
    if not hooks:
        return []
    if resolved is None:
        resolved = event in RESOLVES
    now = timezone.now().isoformat()
    rows: list[AlertDelivery] = []
    for summary, subject in items:
        payload: AlertPayload = {
            "id": uuid.uuid4().hex,
            "event": event,
            "state": "resolved" if resolved else "firing",
            "severity": SEVERITY[event],
            "summary": summary[:500],
            "ts": now,
            "subject": subject,
        }
        rows.extend(
            AlertDelivery(webhook_id=pk, event=event, payload=dict(payload)) for pk in hooks
        )
    ids = [row.pk for row in AlertDelivery.objects.bulk_create(rows)]
    if ids:
        # Robust: a send that fails (the embedded mode sends here) never fails the change.
        transaction.on_commit(lambda: _send_all(ids), robust=True)
    return ids


def _send_all(ids: list[int]) -> None:
    for pk in ids:
        enqueue("fleet.deliver_alert", pk)


def gpu_subject(gpu: Any) -> dict[str, Any]:
    """What names a GPU in an alert (``gpu`` with its host loaded)."""
    return {
        "gpu": {"id": gpu.pk, "uuid": gpu.uuid, "index": gpu.index},
        "host": {"id": gpu.host_id, "name": gpu.host.name},
    }


def alert_operation_ended(operation: Any, *, status: str, reason: str) -> None:
    """Raise ``operation.failed`` / ``operation.expired`` for an operation that just ended so;
    nothing for one that succeeded."""
    if status == OperationStatus.FAILED:
        event = OPERATION_FAILED
    elif status == OperationStatus.EXPIRED:
        event = OPERATION_EXPIRED
    else:
        return
    alert_emit(
        event=event,
        summary=f"Operation {operation.pk} ({operation.kind}) {status}: {operation.summary}",
        subject={
            "operation": {
                "id": operation.pk,
                "kind": operation.kind,
                "status": status,
                "summary": operation.summary,
                "reason": reason[:1000],
            },
            "host": {"id": operation.host_id} if operation.host_id else None,
            "gpu": {"id": operation.gpu_id} if operation.gpu_id else None,
            "deployment": {"id": operation.deployment_id} if operation.deployment_id else None,
        },
    )
