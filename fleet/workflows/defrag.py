"""Defragmentation that applies: the defrag planner's proposal for a deployment (the fewest moves
of other replicas after which its next replica fits) carried out as moves, then the replica
placed.

One ``defrag`` operation holds its ``plan`` in its payload, one step per planned move:

* a replica's move, make before break (:mod:`fleet.allocations.moves`); for a MIG replica the
  slice it leaves is then destroyed once its old copy has exited, which is the room the plan
  counted on;
* an idle MIG instance in the way, destroyed (a layout change the agent applies).

Each step waits for the one before it. A move that fails rolls itself back (its replica keeps
running where it was) and stops the defrag, with the reason; the moves already done stay (each
left a running replica). When every step is done, the next replica is placed with the default
strategy. The engine (:mod:`fleet.workflows.engine`) advances it: after the transaction that
started it, after agent reports and acks, when one of its moves ends, and from beat.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal, NotRequired

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.moves import allocation_move
from fleet.allocations.planning.repack_plans import step_of
from fleet.allocations.rankings import deployment_defrag_plan
from fleet.allocations.services import lock_deployment
from fleet.core.errors import Conflict, NotFound, ServiceError
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import (
    RUNNING,
    WorkflowPayload,
    operation_record,
    operation_refuse_running,
)
from fleet.partitioning.instances import instance_destroy
from fleet.partitioning.models import Partition
from fleet.workflows.engine import Outcome, Run, Workflow, workflow_run

# What one step of a plan says: done, waiting, or (the run has failed) failed.
StepOutcome = Literal["next", "wait", "failed"]

# Each step of a plan goes through these (``payload["step"]``, or a repack group's ``step``).
STEP_LABELS = {
    "start": "Starting the next step",
    "moving": "Moving a replica",
    "freeing": "Waiting for the old copy to exit",
    "reshaping": "Destroying a slice",
    "done": "Done",
    "failed": "Failed",
}


class DefragPayload(WorkflowPayload):
    """A defrag's payload: its ``plan`` (one step per planned move) and where it is in it."""

    index: int
    placed: NotRequired[list[int]]
    gpus: NotRequired[list[int]]


def move_timeout_s() -> float:
    return float(getattr(settings, "FLEET_MOVE_TIMEOUT_SECONDS", 300.0))


@transaction.atomic
def deployment_defrag_apply(*, deployment_id: int, requested_by: Any = None) -> Operation:
    """Apply the defrag proposal for the deployment's next replica; returns the ``defrag``
    operation (follow it). Refuses when the replica fits now (``defrag.fits_now``: place it),
    when no plan exists (``defrag.no_plan``), or when a defrag of it is running."""
    if not Deployment.objects.filter(pk=deployment_id).exists():
        raise NotFound(
            "deployment.not_found",
            f"Deployment {deployment_id} does not exist.",
            {"deployment": deployment_id},
        )
    deployment = lock_deployment(deployment_id)
    _check_startable(deployment)
    plan = deployment_defrag_plan(deployment)
    if plan.target is None:
        raise Conflict(
            "defrag.no_plan",
            f"No plan of a few moves lets the next replica of {deployment.name} fit.",
            {"deployment": deployment_id},
        )
    if not plan.moves:
        raise Conflict(
            "defrag.fits_now",
            f"The next replica of {deployment.name} fits now: place it.",
            {"deployment": deployment_id},
        )
    steps = [step_of(move) for move in plan.moves]
    # Every GPU it touches: reclaims keep away from them while it runs (running_reclaims).
    gpus = {plan.target.gpu_id, *plan.target.gpu_ids, *(m.from_gpu for m in plan.moves)}
    gpus |= {m.to_gpu for m in plan.moves if m.to_gpu is not None}
    now = timezone.now()
    operation = operation_record(
        kind=OperationKind.DEFRAG,
        summary=f"Defragment for {deployment.name}: {len(steps)} step(s), then place a replica",
        requested_by=requested_by,
        deployment=deployment,
        status=OperationStatus.DISPATCHED,
        payload=DefragPayload(
            plan=steps,
            index=0,
            step="start",
            log=[{"step": None, "note": "plan accepted", "at": now.isoformat()}],
            deadline=(now + timedelta(seconds=move_timeout_s() * (len(steps) + 1))).isoformat(),
            gpus=sorted(gpus),
        ),
    )
    advance_after_commit(operation.pk)
    return operation


def _check_startable(deployment: Deployment) -> None:
    operation_refuse_running(
        OperationKind.DEFRAG,
        "defrag.in_progress",
        f"A defrag for {deployment.name} is already running (operation {{operation}}).",
        deployment=deployment,
    )
    placed = deployment.allocations.placed().values("replica").distinct().count()
    if placed >= deployment.replicas:
        raise Conflict(
            "deployment.fully_placed",
            f"All {deployment.replicas} replica(s) of {deployment.name} are already placed.",
            {"replicas": deployment.replicas},
        )


class Defrag(Workflow):
    kind = OperationKind.DEFRAG
    steps = STEP_LABELS

    def advance(self, run: Run) -> Outcome:
        payload = run.payload
        while payload["index"] < len(payload["plan"]):
            step = payload["plan"][payload["index"]]
            outcome = advance_step(run, step, payload, f"step {payload['index'] + 1}")
            if outcome != "next":
                return outcome
            payload["index"] += 1
            payload["step"] = "start"
        return _place(run)

    def timeout_reason(self, run: Run) -> str:
        payload = run.payload
        return f"step {payload['index'] + 1} did not finish in time ({payload['step']})"


WORKFLOW = Defrag()


def defrag_advance(*, operation_id: int) -> str:
    """Move the defrag on as far as it can go now: ``wait``, ``done`` or ``failed``."""
    return workflow_run(WORKFLOW, operation_id)


def advance_step(run: Run, step: dict[str, Any], state: dict[str, Any], n: str) -> StepOutcome:
    """One step of a plan forward: ``next`` when it is done, ``wait``, or ``failed`` (the run
    failed, with the reason). ``state`` holds the step's ``step`` (the payload itself for a
    defrag, one GPU's group for a repack); ``n`` names the step in the log (``step 2``)."""
    if state["step"] == "start":
        if step["kind"] == "destroy_idle":
            return _destroy(run, step, state, step["partition"], n)
        if step["allocation"] is None or not Allocation.objects.placed().filter(
            pk=step["allocation"]
        ):
            run.note(f"{n}: the replica to move is gone; nothing to move")
            return "next"
        _start_move(run, step, state, n)
    if state["step"] == "moving":  # a replica Fleet does not run has moved already
        move = Operation.objects.get(pk=step["move"])
        if move.status in RUNNING:
            return "wait"
        if move.status != OperationStatus.SUCCEEDED:
            run.fail(
                f"{n}: the move failed ({move.reason}); its replica keeps running where it "
                "was, and the moves before it stay"
            )
            return "failed"
        if not step["destroy_source"]:
            return "next"
        state["step"] = "freeing"
    if state["step"] == "freeing":
        # The old copy exits before its slice can go: the room the plan counted on.
        if Allocation.objects.filter(partition_id=step["from_partition"]).exists():
            return "wait"
        return _destroy(run, step, state, step["from_partition"], n)
    if state["step"] == "reshaping":
        layout = Operation.objects.get(pk=step["layout"])
        if layout.status in RUNNING:
            return "wait"
        if layout.status != OperationStatus.SUCCEEDED:
            run.fail(f"{n}: destroying the idle slice failed ({layout.reason})")
            return "failed"
    return "next"


def _start_move(run: Run, step: dict[str, Any], state: dict[str, Any], n: str) -> None:
    operation = run.operation
    move = allocation_move(
        allocation_id=step["allocation"],
        partition_id=step["partition"],
        gpu_id=step["gpu"],
        start=step["start"],
        # A fleet operator's repack or defragmentation: the team asked for none of it.
        over_quota_reason=f"{operation.kind} (operation {operation.pk}), {n}",
        requested_by=operation.requested_by,
    )
    run.adopt(move)
    step["move"] = move.pk
    state["step"] = "moving"
    run.note(f"{n}: moving allocation {step['allocation']} (operation {move.pk})")


def _destroy(
    run: Run, step: dict[str, Any], state: dict[str, Any], partition_id: int, n: str
) -> StepOutcome:
    """Destroy an idle MIG instance (gone already: nothing to do)."""
    partition = Partition.objects.filter(pk=partition_id).first()
    if partition is None:
        return "next"
    if partition.allocations.exists():
        raise Conflict(
            "defrag.partition_busy",
            f"{n}: {partition} is no longer idle; the plan is out of date. Ask for a new one.",
            {"partition": partition_id},
        )
    layout = instance_destroy(partition, requested_by=run.operation.requested_by)
    run.adopt(layout)
    step["layout"] = layout.pk
    state["step"] = "reshaping"
    run.note(f"{n}: destroying idle {partition} (operation {layout.pk})")
    return "next" if layout.status == OperationStatus.SUCCEEDED else "wait"


def _place(run: Run) -> Outcome:
    operation = run.operation
    if operation.deployment_id is None:  # deleted while its room was being made
        return run.fail("the deployment was deleted")
    try:
        with transaction.atomic():
            placed = deployment_autoplace(
                deployment_id=operation.deployment_id,
                limit=1,
                requested_by=operation.requested_by,
            )
    except ServiceError as error:
        return run.fail(f"the moves are done but the replica still does not fit: {error.message}")
    where = placed[0].summary if placed else "nothing left to place"
    run.payload["placed"] = [op.pk for op in placed]
    return run.succeed(f"{len(run.payload['plan'])} step(s) done; {where}")
