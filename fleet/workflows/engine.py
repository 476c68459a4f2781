"""The one engine every long-running operation goes through, as NetBox's ``JobRunner`` is for
jobs. A :class:`Workflow` declares its steps (and their labels), its deadline and its
compensation; the engine owns the rest:

* advancing, under the operation's row lock (:func:`operation_lock_running`): two workers
  advancing one operation take turns, and the later one finds it moved on;
* the deadline: a workflow still waiting past ``payload["deadline"]`` fails, compensated;
* errors: a :class:`ServiceError` from a step ends the operation ``failed`` with its message,
  compensated, instead of escaping (a task retrying every few seconds);
* the log (``payload["log"]``) and the terminal write, always :func:`operation_finish`, so every
  ending alerts the webhooks that subscribe;
* waking the parent when a child ends (``Operation.parent``: :func:`operation_finish`).

A payload speaks one vocabulary (:class:`WorkflowPayload`): ``step`` is where it is, ``log`` what
it did, ``plan`` what it will do. A workflow's :meth:`Workflow.advance` is safe to call any time:
after the transaction that started it, after the acks and reports that wake it, and from beat.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from datetime import datetime
from typing import Any, ClassVar, Literal

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.core.errors import ServiceError
from fleet.core.events import publish_changed
from fleet.core.models import Operation, OperationStatus
from fleet.core.operations import (
    LogEntry,
    WorkflowPayload,
    operation_finish,
    operation_lock_running,
)

__all__ = ["DONE", "FAILED", "WAIT", "LogEntry", "Outcome", "Run", "Workflow", "WorkflowPayload"]

Outcome = Literal["wait", "done", "failed"]
WAIT: Outcome = "wait"
DONE: Outcome = "done"
FAILED: Outcome = "failed"


class Run:
    """One advance of one operation: its locked row, its payload being edited, how it ends."""

    def __init__(self, operation: Operation) -> None:
        self.operation = operation
        # A deep copy: steps edit nested plans, and the row's payload is what a refusal restores.
        self.payload: dict[str, Any] = copy.deepcopy(operation.payload)
        self.ending: tuple[str, str] | None = None
        self.result: dict[str, Any] | None = None

    def note(self, note: str, *, step: str | None = None) -> None:
        """``note`` joins the log under the current step; the run moves to ``step`` if given."""
        entry: LogEntry = {"step": self.payload.get("step"), "note": note, "at": _now()}
        self.payload["log"] = [*self.payload.get("log", []), entry]
        if step is not None:
            self.payload["step"] = step

    def succeed(self, reason: str, result: dict[str, Any] | None = None) -> Outcome:
        """End it ``succeeded`` with ``reason`` (written by the engine)."""
        self.ending = (OperationStatus.SUCCEEDED, reason)
        self.result = result if result is not None else self.result
        return DONE

    def fail(self, reason: str, result: dict[str, Any] | None = None) -> Outcome:
        """End it ``failed`` with ``reason``, once the workflow has compensated."""
        self.ending = (OperationStatus.FAILED, reason)
        self.result = result if result is not None else self.result
        return FAILED

    def adopt(self, child: Operation) -> None:
        """``child`` (a move, a layout change, a drain) belongs to this operation: its ending
        wakes this one."""
        self.adopt_all([child.pk])

    def adopt_all(self, child_ids: list[int]) -> None:
        Operation.objects.filter(pk__in=child_ids).update(parent=self.operation)


class Workflow(ABC):
    """A long-running kind. Subclasses set ``kind`` and ``steps`` (each step's label, in order,
    as the UI words it) and implement :meth:`advance`; they may override :meth:`compensate`,
    :meth:`deadline` and :meth:`timeout_reason`."""

    kind: ClassVar[str]
    steps: ClassVar[dict[str, str]] = {}

    @abstractmethod
    def advance(self, run: Run) -> Outcome:
        """Go as far as possible now: ``wait`` (saved, woken again later), or the outcome of
        :meth:`Run.succeed` / :meth:`Run.fail`. A :class:`ServiceError` fails the run."""

    def compensate(self, run: Run, reason: str) -> str | None:
        """Undo what a failed run can undo (roll back, uncordon...); returns the reason it ends
        with, or ``None`` while the undoing takes steps of its own (a layout rolled back on the
        agent): the run then waits, and ends later through :meth:`Run.fail`, compensated again.
        By default there is nothing to undo: each step left a consistent fleet."""
        return reason

    def deadline(self, run: Run) -> datetime | None:
        """When a waiting run fails: ``payload["deadline"]`` by default."""
        return deadline_of(run.payload)

    def timeout_reason(self, run: Run) -> str:
        return f"did not finish in time (step {run.payload.get('step')})"


def deadline_of(payload: dict[str, Any]) -> datetime | None:
    raw = payload.get("deadline")
    return parse_datetime(raw) if isinstance(raw, str) else None


def workflow_run(workflow: Workflow, operation_id: int) -> Outcome:
    """Move one operation of ``workflow``'s kind on as far as it can go now, under its row lock;
    ``done`` for one that has ended already (or is of another kind)."""
    with transaction.atomic():
        operation = operation_lock_running(operation_id, workflow.kind)
        if operation is None:
            return DONE
        run = Run(operation)
        loaded = copy.deepcopy(operation.payload)
        try:
            # A savepoint: a refusal undoes the step's own writes before compensation runs.
            with transaction.atomic():
                outcome = workflow.advance(run)
            if outcome == WAIT and _past(workflow.deadline(run)):
                outcome = run.fail(workflow.timeout_reason(run))
        except ServiceError as error:
            # The savepoint undid the step's writes: its payload edits go too.
            operation.payload, run.payload = loaded, copy.deepcopy(loaded)
            outcome = run.fail(error.message)
        return _write(workflow, run, outcome)


def _write(workflow: Workflow, run: Run, outcome: Outcome) -> Outcome:
    operation = run.operation
    if run.ending is None:
        if run.payload != operation.payload:
            operation.payload = run.payload
            operation.save(update_fields=["payload", "updated_at"])
            publish_changed("operation", [operation.pk])
        return outcome
    status, reason = run.ending
    if status != OperationStatus.SUCCEEDED:
        compensated = _compensate(workflow, run, reason)
        if compensated is None:  # undoing takes steps of its own: it waits for them
            run.ending = None
            return _write(workflow, run, WAIT)
        reason = compensated
    operation.payload = run.payload
    operation_finish(operation, status, reason, result=run.result)
    if operation.deployment_id is not None:
        publish_changed("deployment", [operation.deployment_id])
    return outcome


def _compensate(workflow: Workflow, run: Run, reason: str) -> str | None:
    """The workflow's compensation; one refused (its own savepoint undone) ends the run with
    both reasons rather than leaving it to retry forever."""
    try:
        with transaction.atomic():
            return workflow.compensate(run, reason)
    except ServiceError as error:
        return f"{reason}; undoing it failed too: {error.message}"


def _past(deadline: datetime | None) -> bool:
    return deadline is not None and timezone.now() > deadline


def _now() -> str:
    return timezone.now().isoformat()
