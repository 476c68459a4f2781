"""Hosts in maintenance: cordon, uncordon, and drain a whole host.

A cordoned host takes no new replicas (the snapshot marks it cordoned, and the engine refuses it
with ``placement.cordoned``). A **host drain** is one ``drain_host`` operation: the host is set
``draining``, its replicas move off one at a time, make before break
(:func:`fleet.allocations.moves.allocation_move_anywhere`); a replica with nowhere to go is
reported in the operation (``payload["stuck"]``) and tried again on every advance until the
deadline, or stopped when the drain was asked with ``force``. Once nothing is left on the host
it is ``maintenance``: it takes nothing until it is uncordoned. A drain ``at`` a later time waits
(``payload["step"] == "scheduled"``, status ``pending``) until then; uncordon cancels it.

This module starts, cancels and reports host drains; the host drain workflow
(:mod:`fleet.workflows.host_drain`) moves them forward.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NotRequired

from django.db import transaction
from django.utils import timezone

from fleet.allocations.moves import moves_cancel_onto
from fleet.core.errors import Conflict, NotFound, ServiceError
from fleet.core.events import publish_changed
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import (
    RUNNING,
    WorkflowPayload,
    operation_finish,
    operation_record,
    operation_step,
)
from fleet.inventory.models import HELD_STATUSES, Gpu, Host, HostStatus

logger = logging.getLogger(__name__)

MAX_SCHEDULE_AHEAD = timedelta(days=30)
DEFAULT_TIMEOUT_S = 1800.0
RETRY_STUCK_S = 5.0
# What a host can be drained (or cordoned) from: an operator's cordon, or ready. An offline or
# unhealthy host has its own handling (fleet.workflows.offline, health).
DRAINABLE = (HostStatus.READY, HostStatus.CORDONED)


class HostDrainStep(StrEnum):
    """Where a host drain is (``payload["step"]``)."""

    SCHEDULED = "scheduled"
    MOVE = "move"
    WAIT_EMPTY = "wait_empty"
    DONE = "done"
    FAILED = "failed"


class HostDrainPayload(WorkflowPayload):
    """A host drain's payload (fleet.workflows.host_drain advances it)."""

    at: str
    force: bool
    timeout_s: float
    moves: list[int]
    stuck: dict[str, str]
    stopped: list[str]
    was_status: NotRequired[str]
    current_move: NotRequired[int | None]
    failed: NotRequired[dict[str, str]]
    tried_at: NotRequired[str]


def lock_host(host_id: int) -> Host:
    host = Host.objects.select_for_update().filter(pk=host_id).first()
    if host is None:
        raise NotFound("host.not_found", f"Host {host_id} does not exist.", {"host": host_id})
    return host


def _set_status(host: Host, status: str) -> None:
    Host.objects.filter(pk=host.pk).update(status=status, updated_at=timezone.now())
    host.status = status
    publish_changed("host", [host.pk])
    publish_changed("gpu", list(Gpu.objects.filter(host=host).values_list("pk", flat=True)))


def _open_drain(host: Host) -> Operation | None:
    return (
        Operation.objects.select_for_update()
        .filter(kind=OperationKind.DRAIN_HOST, host=host, status__in=RUNNING)
        .first()
    )


@transaction.atomic
def host_cordon(*, host_id: int, requested_by: Any = None) -> Operation:
    """Take the host out of placement: it keeps what it runs and takes nothing new."""
    host = lock_host(host_id)
    if host.status in (HostStatus.DRAINING, HostStatus.MAINTENANCE):
        raise Conflict(
            "host.held",
            f"{host} is {host.status}: it already takes no new replicas.",
            {"status": host.status},
        )
    if host.status not in DRAINABLE:
        raise Conflict(
            "host.not_ready",
            f"{host} is {host.status}; only a ready host can be cordoned.",
            {"status": host.status},
        )
    _set_status(host, HostStatus.CORDONED)
    return operation_record(
        kind=OperationKind.CORDON_HOST,
        summary=f"Cordoned host {host}",
        requested_by=requested_by,
        host=host,
        status=OperationStatus.SUCCEEDED,
    )


@transaction.atomic
def host_uncordon(*, host_id: int, requested_by: Any = None) -> Operation:
    """Return the host to service (cordoned, draining or in maintenance: ready again), and
    cancel its drain, running or scheduled. Replicas already moved stay where they went."""
    host = lock_host(host_id)
    cancelled = _open_drain(host)
    if cancelled is not None:
        who = getattr(requested_by, "username", "") or "an operator"
        _finish(cancelled, OperationStatus.FAILED, f"cancelled: {host} uncordoned by {who}")
    was = host.status
    if was in HELD_STATUSES:
        _set_status(host, HostStatus.READY)
    elif cancelled is None:
        raise Conflict(
            "host.not_cordoned",
            f"{host} is {was}: it is not cordoned and has no drain to cancel.",
            {"status": was},
        )
    note = f" (drain {cancelled.pk} cancelled)" if cancelled is not None else ""
    return operation_record(
        kind=OperationKind.UNCORDON_HOST,
        summary=f"Uncordoned host {host}{note}",
        requested_by=requested_by,
        host=host,
        status=OperationStatus.SUCCEEDED,
        payload={"was": was, "cancelled": cancelled.pk if cancelled is not None else None},
    )


@transaction.atomic
def host_drain(
    *,
    host_id: int,
    at: datetime | None = None,
    force: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    requested_by: Any = None,
    now: datetime | None = None,
) -> Operation:
    """Drain the host now, or ``at`` a later time (at most 30 days ahead): its replicas move
    off one at a time, make before break, then it is in maintenance. Returns the operation."""
    now = now or timezone.now()
    if at is not None and not now < at <= now + MAX_SCHEDULE_AHEAD:
        raise ServiceError(
            "drain.at_invalid",
            "'at' must be in the future and at most 30 days ahead.",
            {
                "field": "at",
                "now": now.isoformat(),
                "latest": (now + MAX_SCHEDULE_AHEAD).isoformat(),
            },
        )
    host = lock_host(host_id)
    running = _open_drain(host)
    if running is not None:
        raise Conflict(
            "host.drain_in_progress",
            f"{host} already has a drain (operation {running.pk}); uncordon cancels it.",
            {"operation": running.pk},
        )
    if host.status not in DRAINABLE:
        raise Conflict(
            "host.not_ready",
            f"{host} is {host.status}; only a ready or cordoned host can be drained.",
            {"status": host.status},
        )
    when = f" at {at.isoformat(timespec='minutes')}" if at is not None else ""
    operation = operation_record(
        kind=OperationKind.DRAIN_HOST,
        summary=f"Drain host {host}{when}",
        requested_by=requested_by,
        host=host,
        status=OperationStatus.PENDING if at is not None else OperationStatus.DISPATCHED,
        payload=HostDrainPayload(
            step=HostDrainStep.SCHEDULED,
            log=[],
            at=(at or now).isoformat(),
            force=force,
            timeout_s=timeout_s,
            moves=[],
            stuck={},
            stopped=[],
        ),
    )
    if at is None:
        host_drain_begin(operation, host, now)
    else:
        publish_changed("host", [host.pk])
    advance_after_commit(operation.pk)
    return operation


def host_drain_begin(operation: Operation, host: Host, now: datetime) -> None:
    """The drain starts now: the host is ``draining`` (it takes nothing new, moves onto it are
    cancelled) and the deadline runs from now."""
    cancelled = []
    for gpu_id in Gpu.objects.filter(host=host).values_list("pk", flat=True):
        cancelled += moves_cancel_onto(gpu_id=gpu_id, reason=f"{host} is draining")
    was = host.status
    _set_status(host, HostStatus.DRAINING)
    Operation.objects.filter(pk=operation.pk).update(
        status=OperationStatus.DISPATCHED, dispatched_at=now
    )
    operation.status = OperationStatus.DISPATCHED
    deadline = now + timedelta(seconds=float(operation.payload["timeout_s"]))
    _step(
        operation,
        HostDrainStep.MOVE,
        f"{host} is draining: it takes no new replicas"
        + (f"; {len(cancelled)} move(s) onto it cancelled" if cancelled else ""),
        was_status=was,
        deadline=deadline.isoformat(),
    )


def _save(operation: Operation, **changes: Any) -> None:
    operation.payload = {**operation.payload, **changes}
    operation.save(update_fields=["payload", "updated_at"])


def _step(operation: Operation, step: str, note: str, **extra: Any) -> None:
    operation_step(operation, note, step=step, **extra)


def _finish(operation: Operation, status: str, reason: str) -> None:
    operation_finish(
        operation, status, reason, done=HostDrainStep.DONE, failed=HostDrainStep.FAILED
    )
    if operation.host_id is not None:
        publish_changed("host", [operation.host_id])


def scheduled_drains(host_ids: list[int]) -> dict[int, Operation]:
    """The open drain (scheduled or running) of each of these hosts, if any."""
    rows = Operation.objects.filter(
        kind=OperationKind.DRAIN_HOST, status__in=RUNNING, host_id__in=host_ids
    ).order_by("created_at")
    return {row.host_id: row for row in rows if row.host_id is not None}
