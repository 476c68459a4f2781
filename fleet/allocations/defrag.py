"""Defragmentation that applies: the defrag planner's proposal for a deployment (the fewest moves
of other replicas after which its next replica fits) carried out as moves, then the replica
placed.

One ``defrag`` operation holds the steps in its ``payload``, in the plan's order:

* a replica's move, make before break (:mod:`fleet.allocations.moves`); for a MIG replica the
  slice it leaves is then destroyed once its old copy has exited, which is the room the plan
  counted on;
* an idle MIG instance in the way, destroyed (a layout change the agent applies).

Each step waits for the one before it. A move that fails rolls itself back (its replica keeps
running where it was) and stops the defrag, with the reason; the moves already done stay (each
left a running replica). When every step is done, the next replica is placed with the default
strategy. :func:`defrag_advance` is safe to call any time: after each agent report, and from
beat.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.drain import current_layout
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.moves import allocation_move
from fleet.allocations.selectors import deployment_defrag_plan
from fleet.allocations.services import lock_deployment
from fleet.core.alerts import alert_operation_ended
from fleet.core.errors import Conflict, NotFound, ServiceError
from fleet.core.events import publish_changed
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import RUNNING, operation_advance, operation_record
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from fleet.placement import Move

logger = logging.getLogger(__name__)


def _timeout_s() -> float:
    return float(getattr(settings, "FLEET_MOVE_TIMEOUT_SECONDS", 300.0))


def _placed_in(partition_id: int) -> int | None:
    """The replica placed in a partition (the planner names MIG and whole-GPU replicas by the
    partition they hold)."""
    found = Allocation.objects.placed().filter(partition_id=partition_id)
    return found.values_list("pk", flat=True).first()


def step_of(move: Move) -> dict[str, Any]:
    if not move.occupied:
        return {"kind": "destroy_idle", "partition": move.allocation_id, "gpu": move.from_gpu}
    if move.kind == "gpu":  # a whole-GPU replica: its partition is the whole GPU
        return {
            "kind": "move",
            "allocation": _placed_in(move.allocation_id),
            "from_partition": move.allocation_id,
            "partition": None,
            "gpu": move.to_gpu,
            "start": None,
            "destroy_source": False,
        }
    if move.kind == "mig":
        return {
            "kind": "move",
            "allocation": _placed_in(move.allocation_id),
            "from_partition": move.allocation_id,
            "partition": move.to_partition_id,
            "gpu": move.to_gpu if move.to_partition_id is None else None,
            "start": move.new_instance.start if move.new_instance else None,
            "destroy_source": True,
        }
    return {
        "kind": "move",
        "allocation": move.allocation_id,
        "from_partition": None,
        "partition": move.to_partition_id,
        "gpu": move.to_gpu if move.to_partition_id is None else None,
        "start": None,
        "destroy_source": False,
    }


@transaction.atomic
def deployment_defrag_apply(*, deployment_id: int, requested_by: Any = None) -> Operation:
    """Apply the defrag proposal for the deployment's next replica; returns the ``defrag``
    operation (follow it). Refuses when the replica fits now (``defrag.fits_now``: place it),
    when no plan exists (``defrag.no_plan``), or when a defrag of it is running."""
    found = Deployment.objects.filter(pk=deployment_id).first()
    if found is None:
        raise NotFound(
            "deployment.not_found",
            f"Deployment {deployment_id} does not exist.",
            {"deployment": deployment_id},
        )
    deployment = lock_deployment(deployment_id)
    running = Operation.objects.filter(
        kind=OperationKind.DEFRAG, deployment=deployment, status__in=RUNNING
    ).first()
    if running is not None:
        raise Conflict(
            "defrag.in_progress",
            f"A defrag for {deployment.name} is already running (operation {running.pk}).",
            {"operation": running.pk},
        )
    placed = deployment.allocations.placed().values("replica").distinct().count()
    if placed >= deployment.replicas:
        raise Conflict(
            "deployment.fully_placed",
            f"All {deployment.replicas} replica(s) of {deployment.name} are already placed.",
            {"replicas": deployment.replicas},
        )
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
    now = timezone.now()
    operation = operation_record(
        kind=OperationKind.DEFRAG,
        summary=f"Defragment for {deployment.name}: {len(steps)} step(s), then place a replica",
        requested_by=requested_by,
        deployment=deployment,
        status=OperationStatus.DISPATCHED,
        payload={
            "steps": steps,
            "index": 0,
            "phase": "start",
            "log": [{"note": "plan accepted", "at": now.isoformat()}],
            "deadline": (now + timedelta(seconds=_timeout_s() * (len(steps) + 1))).isoformat(),
        },
    )
    advance_after_commit(operation.pk)
    return operation


def defrag_advance(*, operation_id: int) -> str:
    """Move the defrag on as far as it can go now; returns its phase."""
    return operation_advance(operation_id, OperationKind.DEFRAG, _advance, _finish)


def _advance(operation: Operation, payload: dict[str, Any]) -> str:
    while payload["index"] < len(payload["steps"]):
        step = payload["steps"][payload["index"]]
        phase = advance_step(operation, payload, step, payload, f"step {payload['index'] + 1}")
        if phase in ("wait", "failed"):
            return phase if phase == "failed" else _check_deadline(operation, payload)
        payload["index"] += 1
        payload["phase"] = "start"
    return _place(operation, payload)


def advance_step(
    operation: Operation,
    payload: dict[str, Any],
    step: dict[str, Any],
    state: dict[str, Any],
    n: str,
) -> str:
    """One step forward: ``next`` when the step is done, ``wait``, or ``failed``. ``state``
    holds the step's ``phase`` (the payload itself for a defrag, one GPU's group for a repack);
    ``n`` names the step in the log (``step 2``). A failure finishes ``operation``."""
    if state["phase"] == "start":
        if step["kind"] == "destroy_idle":
            return _destroy(operation, payload, step, state, step["partition"], n)
        if step["allocation"] is None or not Allocation.objects.placed().filter(
            pk=step["allocation"]
        ):
            _note(payload, f"{n}: the replica to move is gone; nothing to move")
            return "next"
        move = allocation_move(
            allocation_id=step["allocation"],
            partition_id=step["partition"],
            gpu_id=step["gpu"],
            start=step["start"],
            # A fleet operator's repack or defragmentation: the team asked for none of it.
            over_quota_reason=f"{operation.kind} (operation {operation.pk}), {n}",
            requested_by=operation.requested_by,
        )
        step["move"] = move.pk
        state["phase"] = "moving"
        _note(payload, f"{n}: moving allocation {step['allocation']} (operation {move.pk})")
    if state["phase"] == "moving":  # a replica Fleet does not run has moved already
        move = Operation.objects.get(pk=step["move"])
        if move.status in RUNNING:
            return "wait"
        if move.status != OperationStatus.SUCCEEDED:
            _finish(
                operation,
                payload,
                OperationStatus.FAILED,
                f"{n}: the move failed ({move.reason}); its replica keeps running where it "
                "was, and the moves before it stay",
            )
            return "failed"
        if not step["destroy_source"]:
            return "next"
        state["phase"] = "freeing"
    if state["phase"] == "freeing":
        # The old copy exits before its slice can go: the room the plan counted on.
        if Allocation.objects.filter(partition_id=step["from_partition"]).exists():
            return "wait"
        return _destroy(operation, payload, step, state, step["from_partition"], n)
    if state["phase"] == "reshaping":
        layout = Operation.objects.get(pk=step["layout"])
        if layout.status in RUNNING:
            return "wait"
        if layout.status != OperationStatus.SUCCEEDED:
            _finish(
                operation,
                payload,
                OperationStatus.FAILED,
                f"{n}: destroying the idle slice failed ({layout.reason})",
            )
            return "failed"
        return "next"
    return "next"


def _destroy(
    operation: Operation,
    payload: dict[str, Any],
    step: dict[str, Any],
    state: dict[str, Any],
    partition_id: int,
    n: str,
) -> str:
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
    spec = current_layout(partition.gpu)
    kept = tuple(i for i in spec.instances if i.start != partition.start)
    layout = gpu_set_layout(
        gpu_id=partition.gpu_id,
        spec=LayoutSpec(mode=spec.mode, instances=kept),
        requested_by=operation.requested_by,
    )
    step["layout"] = layout.pk
    state["phase"] = "reshaping"
    _note(payload, f"{n}: destroying idle {partition} (operation {layout.pk})")
    return "next" if layout.status == OperationStatus.SUCCEEDED else "wait"


def _place(operation: Operation, payload: dict[str, Any]) -> str:
    if operation.deployment_id is None:  # deleted while its room was being made
        _finish(operation, payload, OperationStatus.FAILED, "the deployment was deleted")
        return "failed"
    try:
        with transaction.atomic():
            placed = deployment_autoplace(
                deployment_id=operation.deployment_id,
                limit=1,
                requested_by=operation.requested_by,
            )
    except ServiceError as error:
        _finish(
            operation,
            payload,
            OperationStatus.FAILED,
            f"the moves are done but the replica still does not fit: {error.message}",
        )
        return "failed"
    where = placed[0].summary if placed else "nothing left to place"
    payload["placed"] = [op.pk for op in placed]
    _finish(
        operation,
        payload,
        OperationStatus.SUCCEEDED,
        f"{len(payload['steps'])} step(s) done; {where}",
    )
    return "done"


def _check_deadline(operation: Operation, payload: dict[str, Any]) -> str:
    deadline = parse_datetime(payload["deadline"])
    if deadline is not None and timezone.now() > deadline:
        _finish(
            operation,
            payload,
            OperationStatus.FAILED,
            f"step {payload['index'] + 1} did not finish in time ({payload['phase']})",
        )
        return "failed"
    return "wait"


def _note(payload: dict[str, Any], note: str) -> None:
    payload["log"] = [*payload.get("log", []), {"note": note, "at": timezone.now().isoformat()}]


def _finish(operation: Operation, payload: dict[str, Any], status: str, reason: str) -> None:
    _note(payload, reason)
    payload["phase"] = "done" if status == OperationStatus.SUCCEEDED else "failed"
    Operation.objects.filter(pk=operation.pk).update(
        status=status,
        reason=reason[:2000],
        payload=payload,
        finished_at=timezone.now(),
        updated_at=timezone.now(),
    )
    alert_operation_ended(operation, status=status, reason=reason)
    publish_changed("operation", [operation.pk])
    if operation.deployment_id is not None:
        publish_changed("deployment", [operation.deployment_id])


def defrags_advance() -> list[str]:
    """Advance every running defrag: after agent reports and acks, and from beat."""
    running = Operation.objects.filter(kind=OperationKind.DEFRAG, status__in=RUNNING)
    return [defrag_advance(operation_id=pk) for pk in running.values_list("pk", flat=True)]
