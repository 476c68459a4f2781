"""The move workflow: a replica's new copy, started by
:func:`fleet.allocations.moves.allocation_move` (make before break), waits until it runs; then
the old copy is released and the new one becomes the replica.

A failure (the new copy fails, crash-loops or exits; the deadline passes; someone evicts it)
is compensated by releasing the target: the old copy keeps running. The old copy evicted
meanwhile leaves the new one as the replica. The engine (:mod:`fleet.workflows.engine`) advances
it after each workload report of the target's host, and from beat.
"""

from __future__ import annotations

from django.utils import timezone

from fleet.allocations.models import FAILED_STATES, AllocationState, WorkloadState
from fleet.allocations.move_copies import (
    copy_ids,
    copy_promote,
    copy_rollback,
    copy_rows,
    copy_switch,
)
from fleet.allocations.moves import UNRUN_NOTE, MoveStep
from fleet.allocations.services import lock_deployment
from fleet.core.models import OperationKind
from fleet.workflows.engine import WAIT, Outcome, Run, Workflow, workflow_run


class Move(Workflow):
    kind = OperationKind.MOVE
    steps = {
        MoveStep.WAIT_RUNNING: "Waiting for the new copy to run",
        MoveStep.DONE: "Done",
        MoveStep.FAILED: "Failed",
    }

    def advance(self, run: Run) -> Outcome:
        operation, payload = run.operation, run.payload
        if operation.deployment_id is None:  # deleted (SET_NULL): its copies went with it
            return run.fail("the deployment was deleted")
        lock_deployment(operation.deployment_id, allow_deleting=True)  # as place and evict do
        new_ids, old_ids = copy_ids(payload, "to"), copy_ids(payload, "from")
        news, olds = copy_rows(new_ids), copy_rows(old_ids)
        if sum(a.state != AllocationState.RELEASING for a in news) < len(new_ids):
            return run.fail("the new copy was evicted during the move; the old copy stays")
        new = news[0]
        if len(olds) < len(old_ids) or any(a.state == AllocationState.RELEASING for a in olds):
            copy_promote(news)
            return run.succeed("the old copy was evicted during the move; the new copy stays")
        if not payload["make_before_break"]:
            copy_switch(olds, news)
            return run.succeed(UNRUN_NOTE)
        if new.workload_state == WorkloadState.RUNNING:
            copy_switch(olds, news)
            payload["running_at"] = timezone.now().isoformat()
            return run.succeed(
                f"the new copy runs on {new.gpu}; the old copy on {olds[0].gpu} is stopping"
            )
        if new.workload_state in FAILED_STATES:
            detail = f": {new.workload_message}" if new.workload_message else ""
            return run.fail(
                f"the new copy {new.workload_state}{detail}; the old copy keeps running"
            )
        waiting = f"waiting for the new copy to run ({new.workload_state})"
        if payload.get("waiting_for") != waiting:
            run.note(waiting)
            payload["waiting_for"] = waiting
        return WAIT

    def compensate(self, run: Run, reason: str) -> str:
        # Release the target: the new copy stops, the old copy was never touched.
        news = copy_rows(copy_ids(run.payload, "to"))
        copy_rollback([a for a in news if a.state != AllocationState.RELEASING])
        return reason

    def timeout_reason(self, run: Run) -> str:
        news = copy_rows(copy_ids(run.payload, "to"))
        state = news[0].workload_state if news else "gone"
        return (
            f"the new copy was not running within {int(run.payload['timeout_s'])} s (it was "
            f"{state}); the old copy keeps running"
        )


WORKFLOW = Move()


def move_advance(*, operation_id: int) -> str:
    """Move the move forward as far as it can go now: ``wait``, ``done`` or ``failed``."""
    return workflow_run(WORKFLOW, operation_id)
