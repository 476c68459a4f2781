"""The layout rollout workflow: every GPU a rollout selected drained and reshaped (or reshaped
in place), in waves of at most ``max_unavailable``, once
:func:`fleet.allocations.layout_rollouts.layout_rollout_start` recorded it.

The first GPU that fails pauses the rollout (step ``paused``) until an operator resumes or
aborts it; an aborted rollout ends once the drains under way finish. Nothing to compensate: each
drain rolls its own GPU back. The engine (:mod:`fleet.workflows.engine`) advances it after agent
acks, when one of its drains ends, and from beat.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.drain import gpu_drain
from fleet.allocations.layout_rollouts import same_layout
from fleet.allocations.models import Allocation, Deployment
from fleet.core.errors import ServiceError
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import RUNNING
from fleet.inventory.models import Gpu
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from fleet.workflows.engine import WAIT, Outcome, Run, Workflow, workflow_run


class LayoutRollout(Workflow):
    kind = OperationKind.LAYOUT_ROLLOUT
    steps = {
        "rolling": "Reshaping GPUs, a wave at a time",
        "paused": "Paused: resume or abort it",
        "aborting": "Aborted: waiting for the drains under way",
        "done": "Done",
        "failed": "Failed",
    }

    def advance(self, run: Run) -> Outcome:
        payload = run.payload
        _collect(run)
        if payload["paused"] is None and not payload.get("aborted"):
            _start_wave(run)
        if not payload["draining"] and (not payload["pending"] or payload.get("aborted")):
            return _finish(run)
        payload["step"] = (
            "paused" if payload["paused"] else "aborting" if payload.get("aborted") else "rolling"
        )
        return WAIT


WORKFLOW = LayoutRollout()


def layout_rollout_advance(*, operation_id: int) -> str:
    """Move the rollout on: collect finished drains, start the next wave. Returns ``wait``,
    ``done`` or ``failed`` (aborted)."""
    return workflow_run(WORKFLOW, operation_id)


def _collect(run: Run) -> None:
    """Take in the GPUs whose drain (or reshape) ended; the first failure pauses the rollout."""
    payload = run.payload
    for key, drain_id in list(payload["draining"].items()):
        drain = Operation.objects.filter(pk=drain_id).first()
        if drain is not None and drain.status in RUNNING:
            continue
        del payload["draining"][key]
        if drain is not None and drain.status == OperationStatus.SUCCEEDED:
            payload["done"].append(int(key))
            continue
        reason = drain.reason if drain is not None else "its drain vanished"
        payload["pending"].insert(0, int(key))  # tried again on resume
        if payload["paused"] is None:
            payload["paused"] = f"GPU {key}: {reason}"
            run.note(f"paused: GPU {key}: {reason}")


def _stored_layout(payload: dict[str, Any], gpu_id: int) -> LayoutSpec | None:
    per_gpu = payload.get("layouts")
    raw = per_gpu.get(str(gpu_id)) if per_gpu is not None else payload["layout"]
    return LayoutSpec.from_json(raw) if raw is not None else None


def _reshape_in_place(gpu: Gpu, layout: LayoutSpec, requested_by: Any) -> Operation | None:
    """Reshape a MIG GPU that runs replicas without a drain when the new layout keeps every
    partition they run in (``gpu_set_layout`` refuses otherwise, and then the GPU drains)."""
    if layout.mode != "mig" or gpu.mode != "mig":
        return None
    if not Allocation.objects.filter(gpu=gpu).exists():
        return None  # nothing runs there: the drain path costs nothing and cordons meanwhile
    try:
        with transaction.atomic():
            return gpu_set_layout(gpu_id=gpu.pk, spec=layout, requested_by=requested_by)
    except ServiceError:
        return None


def _start_wave(run: Run) -> None:
    operation, payload = run.operation, run.payload
    while payload["pending"] and len(payload["draining"]) < payload["max_unavailable"]:
        gpu_id = int(payload["pending"][0])
        gpu = Gpu.objects.filter(pk=gpu_id).first()
        layout = _stored_layout(payload, gpu_id)
        if gpu is None or layout is None or same_layout(gpu, layout):
            payload["pending"].pop(0)
            if gpu is not None:
                payload["done"].append(gpu_id)
            continue
        reshape = _reshape_in_place(gpu, layout, operation.requested_by)
        if reshape is not None:
            payload["pending"].pop(0)
            run.adopt(reshape)
            payload["draining"][str(gpu_id)] = reshape.pk
            run.note(f"reshaping GPU {gpu_id} in place (operation {reshape.pk})")
            continue
        try:
            with transaction.atomic():
                drain = gpu_drain(
                    gpu_id=gpu_id,
                    layout=layout,
                    timeout_s=payload["timeout_s"],
                    # Its replicas had better not land on a GPU this rollout drains later.
                    avoid_gpus=[*payload["pending"], *map(int, payload["draining"])],
                    requested_by=operation.requested_by,
                )
        except ServiceError as error:
            payload["paused"] = f"GPU {gpu_id}: {error.message}"
            run.note(f"paused: {payload['paused']}")
            return
        payload["pending"].pop(0)
        run.adopt(drain)
        payload["draining"][str(gpu_id)] = drain.pk
        run.note(f"draining GPU {gpu_id} (operation {drain.pk})")


def _place_waiting(run: Run) -> None:
    """Place the waiting replicas of the deployments the rollout names, one at a time, as many
    as fit (each in its own savepoint: one that fits nowhere leaves the others placed)."""
    payload = run.payload
    placed = 0
    for deployment in Deployment.objects.filter(
        pk__in=payload.get("place_waiting") or (), deleting=False
    ).order_by("name"):
        while True:
            try:
                with transaction.atomic():
                    if not deployment_autoplace(deployment_id=deployment.pk, limit=1):
                        break
            except ServiceError:
                break
            placed += 1
    if payload.get("place_waiting"):
        run.note(f"placed {placed} waiting replica(s)")


def _finish(run: Run) -> Outcome:
    done = len(run.payload["done"])
    if run.payload.get("aborted"):
        return run.fail(f"aborted by an operator after {done} GPU(s)")
    _place_waiting(run)
    return run.succeed(f"{done} GPU(s) reshaped")
