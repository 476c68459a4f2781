"""The audit trail's one writer: every change in flight, or done, is an :class:`Operation`.

Every floor records operations (a host created, a layout set, a replica placed, a GPU gone
unhealthy), so the writer lives on the lowest one and knows the rows it points at only by their
ids (``gpu.host_id``): core imports no app above it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, Protocol, TypedDict

from django.utils import timezone

from fleet.core.alerts import alert_operation_ended
from fleet.core.errors import Conflict
from fleet.core.events import publish_changed
from fleet.core.jobs import advance_after_commit
from fleet.core.models import FINAL_STATUSES, Operation, OperationStatus


class LogEntry(TypedDict):
    """One line of a long-running operation's progress: the step it was in, what happened,
    when."""

    step: NotRequired[str | None]
    note: str
    at: str


class WorkflowPayload(TypedDict, total=False):
    """What every long-running operation's ``payload`` holds beside its own keys: ``step`` (where
    it is), ``log`` (what it did), ``plan`` (what it will do, where it plans ahead) and the
    ``deadline`` of a waiting one (fleet.workflows.engine)."""

    step: str
    log: list[LogEntry]
    plan: list[Any]
    deadline: str
    waiting_for: str


# An operation in flight: recorded, or handed to an agent or a worker, and not ended.
RUNNING = (OperationStatus.PENDING, OperationStatus.DISPATCHED)


def operation_refuse_running(kind: str, code: str, message: str, **scope: Any) -> None:
    """409 ``code`` when an operation of ``kind`` (on ``scope``: ``deployment=``, ``gpu=``...)
    is still running: one long-running change at a time. ``message`` may name it as
    ``{operation}``. Its row is locked, so a concurrent start waits for this one's verdict."""
    running = (
        Operation.objects.select_for_update()
        .filter(kind=kind, status__in=RUNNING, **scope)
        .values_list("pk", flat=True)
        .first()
    )
    if running is not None:
        raise Conflict(code, message.format(operation=running), {"operation": running})


def operation_lock_running(operation_id: int, kind: str | None = None) -> Operation | None:
    """The operation, row-locked for the caller's transaction, while it is still running (and
    of ``kind`` when given); ``None`` once it has ended. What every ``*_advance`` starts with:
    two workers advancing one operation take turns, and the later one finds it moved on."""
    found = Operation.objects.select_for_update().filter(pk=operation_id, status__in=RUNNING)
    if kind is not None:
        found = found.filter(kind=kind)
    return found.first()


class _Row(Protocol):
    @property
    def pk(self) -> Any: ...


class _GpuRow(_Row, Protocol):
    @property
    def host_id(self) -> Any: ...


def operation_record(
    *,
    kind: str,
    summary: str,
    requested_by: Any = None,
    gpu: _GpuRow | None = None,
    host: _Row | None = None,
    deployment: _Row | None = None,
    generation: int | None = None,
    payload: Mapping[str, Any] | None = None,
    status: str = OperationStatus.PENDING,
    reason: str = "",
) -> Operation:
    """Record one operation (``summary`` cut to 255 characters) and tell browsers after commit.

    ``host`` defaults to the GPU's host. An anonymous ``requested_by`` is recorded as nobody.
    """
    operation = Operation.objects.create(
        kind=kind,
        summary=summary[:255],
        requested_by=requested_by if getattr(requested_by, "is_authenticated", False) else None,
        gpu_id=gpu.pk if gpu is not None else None,
        host_id=host.pk if host is not None else (gpu.host_id if gpu is not None else None),
        deployment_id=deployment.pk if deployment is not None else None,
        generation=generation,
        payload=dict(payload or {}),
        status=status,
        reason=reason,
        finished_at=timezone.now() if status in FINAL_STATUSES else None,
    )
    alert_operation_ended(operation, status=status, reason=reason)
    publish_changed("operation", [operation.pk])
    if operation.gpu_id is not None:
        publish_changed("gpu", [operation.gpu_id])
    if operation.deployment_id is not None:
        publish_changed("deployment", [operation.deployment_id])
    if operation.host_id is not None:
        publish_changed("host", [operation.host_id])
    return operation


def operation_step(
    operation: Operation, note: str, *, step: str | None = None, **extra: Any
) -> None:
    """A long-running operation's progress: ``note`` joins its log (``payload["log"]``,
    under the step it is leaving), it moves to ``step`` when given, ``extra`` joins its payload;
    saved, and browsers told."""
    payload = dict(operation.payload)
    payload["log"] = [
        *payload.get("log", []),
        {"step": payload.get("step"), "note": note, "at": timezone.now().isoformat()},
    ]
    if step is not None:
        payload["step"] = step
    payload.update(extra)
    operation.payload = payload
    operation.save(update_fields=["payload", "updated_at"])
    publish_changed("operation", [operation.pk])


def operation_finish(
    operation: Operation,
    status: str,
    reason: str,
    *,
    done: str = "done",
    failed: str = "failed",
    result: dict[str, Any] | None = None,
) -> None:
    """End a long-running operation: ``reason`` joins its log, its step becomes ``done``
    (succeeded) or ``failed``; status, reason, ``result`` (when given) and finish time written;
    webhooks and browsers told, and its parent woken once this commits."""
    now = timezone.now()
    payload = dict(operation.payload)
    payload["log"] = [
        *payload.get("log", []),
        {"step": payload.get("step"), "note": reason, "at": now.isoformat()},
    ]
    payload["step"] = done if status == OperationStatus.SUCCEEDED else failed
    changes: dict[str, Any] = {"result": result} if result is not None else {}
    Operation.objects.filter(pk=operation.pk).update(
        status=status,
        reason=reason[:2000],
        payload=payload,
        finished_at=now,
        updated_at=now,
        **changes,
    )
    operation.status = status
    operation.payload = payload
    alert_operation_ended(operation, status=status, reason=reason)
    publish_changed("operation", [operation.pk])
    if operation.parent_id is not None:
        advance_after_commit(operation.parent_id)
