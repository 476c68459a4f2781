"""Advance any long-running operation by id: the one entry point of the
``fleet.advance_operation`` task, which services ask for after commit
(:func:`fleet.core.jobs.advance_after_commit`) instead of running the next steps in the request
that started them. Each workflow's ``*_advance`` is safe to call any time; beat calls them all
again every few seconds, so a lost or failed task costs a few seconds, never the operation."""

from __future__ import annotations

from collections.abc import Callable

from fleet.allocations.defrag import defrag_advance
from fleet.allocations.drain import drain_advance
from fleet.allocations.layout_rollouts import layout_rollout_advance
from fleet.allocations.maintenance import host_drain_advance
from fleet.allocations.moves import move_advance
from fleet.allocations.repack import repack_advance
from fleet.allocations.rollouts import rollout_advance
from fleet.core.models import Operation, OperationKind

ADVANCERS: dict[str, Callable[..., str]] = {
    OperationKind.DRAIN: drain_advance,
    OperationKind.MOVE: move_advance,
    OperationKind.ROLLOUT: rollout_advance,
    OperationKind.DEFRAG: defrag_advance,
    OperationKind.LAYOUT_ROLLOUT: layout_rollout_advance,
    OperationKind.DRAIN_HOST: host_drain_advance,
    OperationKind.REPACK: repack_advance,
}


def operation_advance(*, operation_id: int) -> str | None:
    """Move the operation forward as far as it can go now; ``None`` for an operation that is
    gone or of a kind that does not advance."""
    kind = Operation.objects.filter(pk=operation_id).values_list("kind", flat=True).first()
    advancer = ADVANCERS.get(kind or "")
    return None if advancer is None else advancer(operation_id=operation_id)
