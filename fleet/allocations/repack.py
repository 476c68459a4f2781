"""Repack: empty whole GPUs of one product by moving the fewest replicas, and apply the plan.

:func:`capacity_repack_plan` asks the pure planner (:func:`fleet.placement.repack.plan_repack`:
CP-SAT, the greedy plan as fallback) with what the database knows beside the snapshot: each
replica's demand (host runtime, labels) and the GPUs it cannot empty (a replica spanning several
GPUs, a move in progress).

:func:`capacity_repack_apply` records one ``repack`` operation whose ``payload`` holds one group
of steps per GPU to empty, in the plan's order; each step is a defrag step
(:func:`fleet.allocations.defrag.advance_step`: a move make before break, the MIG slice it
leaves destroyed, or an idle slice destroyed). At most ``max_unavailable`` GPUs are being
emptied at once; within a GPU the steps run one after another. A failure stops the repack with
its reason; the moves done stay (each left a running replica), the old copy of the failed one
keeps running. :func:`repack_advance` is safe to call any time: after agent reports, and from
beat.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.allocations.defrag import advance_step, step_of
from fleet.allocations.models import Allocation, RequestKind
from fleet.allocations.selectors import fleet_snapshot, placement_demand, placement_request
from fleet.core.alerts import alert_operation_ended
from fleet.core.errors import Conflict
from fleet.core.events import publish_changed
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import RUNNING, operation_advance, operation_record
from fleet.inventory.models import Gpu
from fleet.placement import Demand, PlacementRequest
from fleet.placement.repack import DEFAULT_TIME_LIMIT_S, RepackPlan, ReplicaKey, plan_repack

logger = logging.getLogger(__name__)


def repack_time_limit_s() -> float:
    """CP-SAT's time limit (``FLEET_REPACK_TIME_LIMIT_SECONDS``, 3 s by default)."""
    return float(getattr(settings, "FLEET_REPACK_TIME_LIMIT_SECONDS", DEFAULT_TIME_LIMIT_S))


def _move_timeout_s() -> float:
    return float(getattr(settings, "FLEET_MOVE_TIMEOUT_SECONDS", 300.0))


@dataclass(frozen=True)
class _Replicas:
    demands: dict[ReplicaKey, Demand]
    requests: dict[ReplicaKey, PlacementRequest]
    pinned: dict[int, str]


def _replicas() -> _Replicas:
    """Each placed replica's demand and request by its plan key, and the GPUs that must stay as
    they are."""
    demands: dict[ReplicaKey, Demand] = {}
    requests: dict[ReplicaKey, PlacementRequest] = {}
    pinned: dict[int, str] = {}
    by_deployment: dict[int, Demand | None] = {}
    rows = Allocation.objects.placed().select_related("deployment").order_by("pk")
    for allocation in rows:
        deployment = allocation.deployment
        if deployment.pk not in by_deployment:
            by_deployment[deployment.pk] = placement_demand(deployment)
        name = f"{deployment.name}[{allocation.replica}]"
        if allocation.replaces_id is not None:
            pinned[allocation.gpu_id] = f"a move of {name} onto it is in progress"
        if deployment.kind == RequestKind.GPU and (deployment.gpu_count or 1) > 1:
            pinned[allocation.gpu_id] = (
                f"runs {name}, which spans {deployment.gpu_count} GPUs (not moved)"
            )
        key = _key(allocation, deployment.kind)
        requests[key] = placement_request(deployment)
        demand = by_deployment[deployment.pk]
        if demand is not None:
            demands[key] = demand
    moving = Allocation.objects.placed().filter(replaces__isnull=False).values("replaces_id")
    for gpu_id in Allocation.objects.filter(pk__in=moving).values_list("gpu_id", flat=True):
        pinned[gpu_id] = "one of its replicas is moving"
    return _Replicas(demands, requests, pinned)


def _key(allocation: Allocation, kind: str) -> ReplicaKey:
    if kind == RequestKind.MPS:
        return ("mps", allocation.pk)
    return ("gpu" if kind == RequestKind.GPU else "mig", allocation.partition_id)


def capacity_repack_plan(
    *, product_key: str, count: int, time_limit_s: float | None = None
) -> RepackPlan:
    """The proposal: moves that empty ``count`` GPUs of ``product_key``, fewest replicas moved
    (changes nothing)."""
    replicas = _replicas()
    return plan_repack(
        fleet_snapshot(),
        product_key,
        count,
        demands=replicas.demands,
        requests=replicas.requests,
        pinned=replicas.pinned,
        time_limit_s=repack_time_limit_s() if time_limit_s is None else time_limit_s,
    )


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
    running = (
        Operation.objects.select_for_update()
        .filter(kind=OperationKind.REPACK, status__in=RUNNING)
        .first()
    )
    if running is not None:
        raise Conflict(
            "repack.in_progress",
            f"A repack is already running (operation {running.pk}).",
            {"operation": running.pk},
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
            "phase": "start",
            "state": "waiting",
        }
        for gpu_id in plan.freed
    ]
    now = timezone.now()
    steps = sum(len(g["steps"]) for g in groups)
    waves = -(-len(groups) // max_unavailable)
    deadline = now + timedelta(seconds=_move_timeout_s() * (steps + waves))
    operation = operation_record(
        kind=OperationKind.REPACK,
        summary=(
            f"Repack {product_key}: empty {len(groups)} GPU(s), {plan.cost} replica(s) moved "
            f"({plan.method})"
        ),
        requested_by=requested_by,
        status=OperationStatus.DISPATCHED,
        payload={
            "product_key": product_key,
            "asked": count,
            "max_unavailable": max_unavailable,
            "method": plan.method,
            "cost": plan.cost,
            "bound": plan.bound,
            "groups": groups,
            "freed": [],
            "phase": "start",
            "log": [
                {"note": f"plan accepted ({plan.method}, {plan.status})", "at": now.isoformat()}
            ],
            "deadline": deadline.isoformat(),
        },
    )
    advance_after_commit(operation.pk)
    return operation


def repack_advance(*, operation_id: int) -> str:
    """Move the repack on as far as it can go now; returns ``wait``, ``done`` or ``failed``."""
    return operation_advance(operation_id, OperationKind.REPACK, _advance, _finish)


def _advance(operation: Operation, payload: dict[str, Any]) -> str:
    groups: list[dict[str, Any]] = payload["groups"]
    while True:
        active = [g for g in groups if g["state"] == "active"]
        for group in groups:
            if len(active) >= payload["max_unavailable"]:
                break
            if group["state"] == "waiting":
                group["state"] = "active"
                active.append(group)
                _note(payload, f"GPU {group['gpu']}: emptying ({len(group['steps'])} step(s))")
        progressed = False
        for group in active:
            phase = _advance_group(operation, payload, group)
            if phase == "failed":  # the step finished the operation with its reason
                result = {"freed_gpus": payload["freed"]}
                Operation.objects.filter(pk=operation.pk).update(result=result)
                return "failed"
            progressed |= phase == "done"
        if all(g["state"] == "done" for g in groups):
            return _done(operation, payload)
        if not progressed:
            return _check_deadline(operation, payload)


def _advance_group(operation: Operation, payload: dict[str, Any], group: dict[str, Any]) -> str:
    while group["index"] < len(group["steps"]):
        step = group["steps"][group["index"]]
        label = f"GPU {group['gpu']} step {group['index'] + 1}"
        phase = advance_step(operation, payload, step, group, label)
        if phase in ("wait", "failed"):
            return phase
        group["index"] += 1
        group["phase"] = "start"
    group["state"] = "done"
    payload["freed"] = [*payload["freed"], group["gpu"]]
    _note(payload, f"GPU {group['gpu']}: empty")
    publish_changed("gpu", [group["gpu"]])
    return "done"


def _done(operation: Operation, payload: dict[str, Any]) -> str:
    names = dict(Gpu.objects.filter(pk__in=payload["freed"]).values_list("pk", "uuid"))
    freed = ", ".join(str(names.get(g, g)) for g in payload["freed"])
    _finish(
        operation,
        payload,
        OperationStatus.SUCCEEDED,
        f"{len(payload['freed'])} GPU(s) freed ({freed}); {payload['cost']} replica(s) moved",
        result={"freed_gpus": payload["freed"]},
    )
    return "done"


def _check_deadline(operation: Operation, payload: dict[str, Any]) -> str:
    deadline = parse_datetime(payload["deadline"])
    if deadline is not None and timezone.now() > deadline:
        _finish(operation, payload, OperationStatus.FAILED, "the repack did not finish in time")
        return "failed"
    return "wait"


def _note(payload: dict[str, Any], note: str) -> None:
    payload["log"] = [*payload.get("log", []), {"note": note, "at": timezone.now().isoformat()}]


def _finish(
    operation: Operation,
    payload: dict[str, Any],
    status: str,
    reason: str,
    result: dict[str, Any] | None = None,
) -> None:
    if status != OperationStatus.SUCCEEDED:
        reason = f"{reason}; {len(payload['freed'])} GPU(s) emptied before it stopped"
    _note(payload, reason)
    payload["phase"] = "done" if status == OperationStatus.SUCCEEDED else "failed"
    Operation.objects.filter(pk=operation.pk).update(
        status=status,
        reason=reason[:2000],
        payload=payload,
        result=result if result is not None else {"freed_gpus": payload["freed"]},
        finished_at=timezone.now(),
        updated_at=timezone.now(),
    )
    operation.status = status
    alert_operation_ended(operation, status=status, reason=reason)
    publish_changed("operation", [operation.pk])


def repacks_advance() -> list[str]:
    """Advance every running repack: after agent reports and acks, and from beat."""
    running = Operation.objects.filter(kind=OperationKind.REPACK, status__in=RUNNING)
    return [repack_advance(operation_id=pk) for pk in running.values_list("pk", flat=True)]


def fleet_products() -> dict[str, str]:
    """The fleet's GPU products: catalog key to name."""
    rows = Gpu.objects.exclude(product_key="").order_by().values_list("product_key", "product_name")
    return {key: name or key for key, name in rows.distinct()}


def repack_payload(plan: RepackPlan, time_limit_s: float | None = None) -> dict[str, Any]:
    """The plan as the API and the capacity page show it: GPUs by host and index, each moved
    replica by its deployment."""
    gpu_ids = {m.from_gpu for m in plan.moves} | {m.to_gpu for m in plan.moves if m.to_gpu}
    gpu_ids |= set(plan.freed) | {g for g, _ in plan.unmovable}
    gpus = {
        g.pk: {"gpu": g.pk, "host": g.host.name, "index": g.index, "uuid": g.uuid}
        for g in Gpu.objects.filter(pk__in=gpu_ids).select_related("host")
    }
    labels = {pk: f"{g['host']}/gpu{g['index']}" for pk, g in gpus.items()}
    return {
        "product": fleet_products().get(plan.product_key, plan.product_key),
        "product_key": plan.product_key,
        "free_gpus": plan.asked,
        "feasible": plan.feasible,
        "reason": plan.reason,
        "method": plan.method,
        "status": plan.status,
        "cost": plan.cost,
        "bound": plan.bound,
        "time_limit_s": repack_time_limit_s() if time_limit_s is None else time_limit_s,
        "already_free": plan.already_free,
        "freed": [gpus[g] for g in plan.freed if g in gpus],
        "unmovable": [{**gpus[g], "reason": why} for g, why in plan.unmovable if g in gpus],
        "moves": _moves(plan, labels),
    }


def _moves(plan: RepackPlan, labels: dict[int, str]) -> list[dict[str, Any]]:
    steps = [step_of(m) for m in plan.moves]
    ids = [s["allocation"] for s in steps if s["kind"] == "move" and s["allocation"]]
    rows = {a.pk: a for a in Allocation.objects.filter(pk__in=ids).select_related("deployment")}
    moves = []
    for move, step in zip(plan.moves, steps, strict=True):
        allocation = rows.get(step.get("allocation") or 0)
        instance = move.new_instance
        moves.append(
            {
                "kind": move.kind,
                "allocation": allocation.pk if allocation else None,
                "deployment": allocation.deployment.name if allocation else None,
                "replica": allocation.replica if allocation else None,
                "from_gpu": move.from_gpu,
                "from_label": labels.get(move.from_gpu, str(move.from_gpu)),
                "to_gpu": move.to_gpu,
                "to_label": labels.get(move.to_gpu) if move.to_gpu else None,
                "to_partition": move.to_partition_id,
                "new_instance": {"profile_id": instance.profile_id, "start": instance.start}
                if instance
                else None,
            }
        )
    return moves
