"""Every long-running kind, once: what advances it and what wakes it. Adding a kind is one
workflow class and one line here; the Celery task (``fleet.advance_operation``), the beat sweep
(``fleet.advance_workflows``), the wake-ups after agent acks and workload reports, and the
contract test (tests/workflows/test_contract.py) all read this list.

What wakes a kind:

* ``ack``: an agent acknowledged a generation (a layout it waits for is applied);
* ``report``: an agent reported its workloads (a new copy runs, an old one stopped);
* ``moved``: a move ended on that report (a drain waits for its moves, wherever they went);
* ``beat``: every few seconds, for deadlines and anything a lost task left behind.

The expiry rule needs no list: beat expires only operations that wait for an agent's ack, which
alone carry a ``generation`` (:func:`fleet.partitioning.delivery.operations_expire`); no workflow
records one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from fleet.core.models import Operation, OperationKind
from fleet.core.operations import RUNNING
from fleet.workflows import (
    defrag,
    deployment_rollouts,
    drain,
    host_drain,
    layout_rollouts,
    moves,
    reclaim,
    repack,
)
from fleet.workflows.engine import Workflow, workflow_run

Wake = Literal["ack", "report", "moved", "beat"]


@dataclass(frozen=True)
class Entry:
    """One long-running kind: its workflow, what wakes it, and how its advance is called (the
    engine running the workflow; a test may stand in)."""

    workflow: Workflow
    wakes: frozenset[Wake]
    # The wake-ups after which only the operations on the woken host advance.
    host_scoped: frozenset[Wake] = frozenset()
    advance: Callable[..., str] | None = None

    @property
    def kind(self) -> str:
        return self.workflow.kind

    @property
    def steps(self) -> Mapping[str, str]:
        return self.workflow.steps

    def advance_one(self, operation_id: int) -> str:
        if self.advance is not None:
            return self.advance(operation_id=operation_id)
        return workflow_run(self.workflow, operation_id)


def _entry(workflow: Workflow, *wakes: Wake, host_scoped: tuple[Wake, ...] = ()) -> Entry:
    return Entry(workflow, frozenset(wakes), frozenset(host_scoped))


# In the order a wake-up advances them: a move before the drain that waits for it.
REGISTRY: tuple[Entry, ...] = (
    _entry(moves.WORKFLOW, "report", "beat", host_scoped=("report",)),
    _entry(drain.WORKFLOW, "ack", "moved", "beat", host_scoped=("ack",)),
    _entry(deployment_rollouts.WORKFLOW, "report", "beat"),
    _entry(defrag.WORKFLOW, "ack", "report", "beat"),
    _entry(repack.WORKFLOW, "ack", "report", "beat"),
    _entry(reclaim.WORKFLOW, "ack", "report", "beat"),
    _entry(host_drain.WORKFLOW, "report", "beat"),
    _entry(layout_rollouts.WORKFLOW, "ack", "beat"),
)
BY_KIND: dict[str, Entry] = {entry.kind: entry for entry in REGISTRY}
LONG_RUNNING_KINDS = frozenset(BY_KIND)


def workflow_advance(*, operation_id: int) -> str | None:
    """Move the operation forward as far as it can go now; ``None`` for an operation that is
    gone or of a kind that does not advance."""
    kind = Operation.objects.filter(pk=operation_id).values_list("kind", flat=True).first()
    entry = BY_KIND.get(kind or "")
    return None if entry is None else entry.advance_one(operation_id)


def workflows_wake(wake: Wake, host_id: int | None = None) -> list[str]:
    """Advance every running operation of the kinds ``wake`` wakes (those of ``host_id`` only,
    where the kind says so); returns their outcomes. A move that ends on a report wakes the
    kinds waiting for moves."""
    outcomes: list[str] = []
    moved = False
    for entry in REGISTRY:
        if wake in entry.wakes:
            scoped = host_id if wake in entry.host_scoped else None
            advanced = _advance_running(entry, scoped)
            moved |= entry.kind == OperationKind.MOVE and "done" in advanced
        elif wake == "report" and moved and "moved" in entry.wakes:
            advanced = _advance_running(entry, None)
        else:
            continue
        outcomes += advanced
    return outcomes


def workflows_advance() -> list[str]:
    """Beat: advance every running long-running operation (deadlines, lost tasks)."""
    return workflows_wake("beat")


def step_labels(kind: str) -> Mapping[str, str]:
    """How the UI words each step of ``kind`` (empty for a kind that declares none)."""
    entry = BY_KIND.get(kind)
    return entry.steps if entry is not None else {}


def _advance_running(entry: Entry, host_id: int | None) -> list[str]:
    running = Operation.objects.filter(kind=entry.kind, status__in=RUNNING)
    if host_id is not None:
        running = running.filter(host_id=host_id)
    ids = running.values_list("pk", flat=True)
    return [entry.advance_one(pk) for pk in ids]
