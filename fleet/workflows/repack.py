"""Repack: empty whole GPUs of one product by moving the fewest replicas, and apply the plan
(:func:`fleet.allocations.planning.repack_plans.capacity_repack_plan`).

:func:`capacity_repack_apply` records one ``repack`` operation whose ``plan`` holds one group of
steps per GPU to empty, in the plan's order; each step is a defrag step
(:func:`fleet.workflows.defrag.advance_step`: a move make before break, the MIG slice it leaves
destroyed, or an idle slice destroyed). At most ``max_unavailable`` GPUs are being emptied at
once; within a GPU the steps run one after another. A failure stops the repack with its reason;
the moves done stay (each left a running replica), the old copy of the failed one keeps running.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from django.db import transaction
from django.utils import timezone

from fleet.allocations.planning.repack_plans import capacity_repack_plan, step_of
from fleet.core.errors import Conflict
from fleet.core.events import publish_changed
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import (
    WorkflowPayload,
    operation_record,
    operation_refuse_running,
)
from fleet.inventory.models import Gpu
from fleet.workflows.defrag import STEP_LABELS, advance_step, move_timeout_s
from fleet.workflows.engine import FAILED, WAIT, Outcome, Run, Workflow, workflow_run


class RepackPayload(WorkflowPayload):
    """A repack's payload: its ``plan`` (one group of steps per GPU to empty)."""

    product_key: str
    asked: int
    max_unavailable: int
    method: str
    cost: int
    bound: Any
    freed: list[int]


@transaction.atomic
def capacity_repack_apply(
    *,
    product_key: str,
    count: int,
    max_unavailable: int = 1,
    requested_by: Any = None,
) -> Operation:
    """Plan and apply a repack; returns the ``repack`` operation (follow it). Refuses while
    another repack runs (``repack.in_progress``) and when no plan exists (``repack.infeasible``,
    with the planner's reason)."""
    operation_refuse_running(
        OperationKind.REPACK,
        "repack.in_progress",
        "A repack is already running (operation {operation}).",
    )
    plan = capacity_repack_plan(product_key=product_key, count=count)
    if not plan.feasible:
        raise Conflict(
            "repack.infeasible", plan.reason, {"product": product_key, "free_gpus": count}
        )
    groups: list[dict[str, Any]] = [
        {
            "gpu": gpu_id,
            "steps": [step_of(m) for m in plan.moves if m.from_gpu == gpu_id],
            "index": 0,
            "step": "start",
            "state": "waiting",
        }
        for gpu_id in plan.freed
    ]
    now = timezone.now()
    steps = sum(len(g["steps"]) for g in groups)
    waves = -(-len(groups) // max_unavailable)
    deadline = now + timedelta(seconds=move_timeout_s() * (steps + waves))
    note = f"plan accepted ({plan.method}, {plan.status})"
    operation = operation_record(
        kind=OperationKind.REPACK,
        summary=(
            f"Repack {product_key}: empty {len(groups)} GPU(s), {plan.cost} replica(s) moved "
            f"({plan.method})"
        ),
        requested_by=requested_by,
        status=OperationStatus.DISPATCHED,
        payload=RepackPayload(
            product_key=product_key,
            asked=count,
            max_unavailable=max_unavailable,
            method=plan.method,
            cost=plan.cost,
            bound=plan.bound,
            plan=groups,
            freed=[],
            step="start",
            log=[{"step": None, "note": note, "at": now.isoformat()}],
            deadline=deadline.isoformat(),
        ),
    )
    advance_after_commit(operation.pk)
    return operation


class Repack(Workflow):
    kind = OperationKind.REPACK
    steps = STEP_LABELS

    def advance(self, run: Run) -> Outcome:
        groups: list[dict[str, Any]] = run.payload["plan"]
        while True:
            active = _activate(run, groups)
            progressed = False
            for group in active:
                outcome = _advance_group(run, group)
                if outcome == FAILED:  # the step failed the run with its reason
                    return FAILED
                progressed |= outcome == "done"
            if all(g["state"] == "done" for g in groups):
                return _done(run)
            if not progressed:
                return WAIT

    def compensate(self, run: Run, reason: str) -> str:
        # Nothing to undo (each move done left a running replica): say what stays.
        freed = run.payload["freed"]
        run.result = {"freed_gpus": freed}
        return f"{reason}; {len(freed)} GPU(s) emptied before it stopped"

    def timeout_reason(self, run: Run) -> str:
        return "the repack did not finish in time"


WORKFLOW = Repack()


def repack_advance(*, operation_id: int) -> str:
    """Move the repack on as far as it can go now; returns ``wait``, ``done`` or ``failed``."""
    return workflow_run(WORKFLOW, operation_id)


def _activate(run: Run, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPUs being emptied, at most ``max_unavailable`` of them, the next ones started."""
    active = [g for g in groups if g["state"] == "active"]
    for group in groups:
        if len(active) >= run.payload["max_unavailable"]:
            break
        if group["state"] == "waiting":
            group["state"] = "active"
            active.append(group)
            run.note(f"GPU {group['gpu']}: emptying ({len(group['steps'])} step(s))")
    return active


def _advance_group(run: Run, group: dict[str, Any]) -> Literal["wait", "done", "failed"]:
    while group["index"] < len(group["steps"]):
        step = group["steps"][group["index"]]
        label = f"GPU {group['gpu']} step {group['index'] + 1}"
        outcome = advance_step(run, step, group, label)
        if outcome != "next":
            return outcome
        group["index"] += 1
        group["step"] = "start"
    group["state"] = "done"
    run.payload["freed"] = [*run.payload["freed"], group["gpu"]]
    run.note(f"GPU {group['gpu']}: empty")
    publish_changed("gpu", [group["gpu"]])
    return "done"


def _done(run: Run) -> Outcome:
    freed_ids = run.payload["freed"]
    names = dict(Gpu.objects.filter(pk__in=freed_ids).values_list("pk", "uuid"))
    freed = ", ".join(str(names.get(g, g)) for g in freed_ids)
    return run.succeed(
        f"{len(freed_ids)} GPU(s) freed ({freed}); {run.payload['cost']} replica(s) moved",
        result={"freed_gpus": freed_ids},
    )
