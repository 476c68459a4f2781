"""Fleet-wide layout rollouts: one layout for every GPU a selector picks (or one per GPU: the
layout advisor's proposal, or a mig-parted config's entry for each GPU), applied with
drain-and-reshape (:mod:`fleet.allocations.drain`: replicas move make before break, the new
layout is applied and verified, a failure rolls that GPU back) in waves of at most
``max_unavailable`` GPUs. A GPU whose new layout keeps every partition that runs a replica is
reshaped in place (:func:`gpu_set_layout` keeps those partitions and their replicas), without a
drain. The first GPU that fails pauses the rollout, with its reason; an
operator resumes it (that GPU is tried again) or aborts it (drains under way finish, no new
ones start). A dry run lists the GPUs, the replicas that would move and whether each has
somewhere to go.

One ``layout_rollout`` operation holds it in its ``payload``; :func:`layout_rollout_advance` is
safe to call any time (after agent acks and reports, and from beat).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.drain import current_layout, gpu_drain
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.selectors import deployment_ranking
from fleet.core.alerts import alert_operation_ended
from fleet.core.errors import Conflict, NotFound, ServiceError
from fleet.core.events import publish_changed
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import RUNNING, operation_lock_running, operation_record
from fleet.inventory.models import Gpu
from fleet.partitioning import converters
from fleet.partitioning.services import LayoutSpec, gpu_set_layout

logger = logging.getLogger(__name__)

MAX_GPUS = 1000
MAX_UNAVAILABLE = 64


@dataclass(frozen=True)
class Selector:
    """Which GPUs: a product (NVML name or catalog key), host labels every host must carry, and
    optionally explicit hosts or GPUs."""

    product: str = ""
    labels: Mapping[str, str] | None = None
    hosts: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "product": self.product,
            "labels": dict(self.labels or {}),
            "hosts": list(self.hosts),
            "gpus": list(self.gpus),
        }


def selected_gpus(selector: Selector) -> QuerySet[Gpu]:
    gpus = Gpu.objects.select_related("host").order_by("host__name", "index")
    if selector.product:
        gpus = gpus.filter(product_name=selector.product) | gpus.filter(
            product_key=selector.product
        )
    for key, value in (selector.labels or {}).items():
        gpus = gpus.filter(**{f"host__labels__{key}": value})
    if selector.hosts:
        gpus = gpus.filter(host_id__in=selector.hosts)
    if selector.gpus:
        gpus = gpus.filter(pk__in=selector.gpus)
    return gpus.order_by("host__name", "index")


def _same_layout(gpu: Gpu, layout: LayoutSpec) -> bool:
    """Whether the GPU's desired layout already is ``layout`` (profiles by id or by name, and
    the MPS daemons: MPS turned on inside existing instances is a change)."""
    now = current_layout(gpu)
    if now.mode != layout.mode or now.mps != layout.mps:
        return False
    product = converters.product_of(gpu)

    def ids(spec: LayoutSpec) -> list[tuple[int, int, str]] | None:
        found = []
        for instance in spec.instances:
            profile = product.profile(instance.profile) if product is not None else None
            if profile is None:
                return None
            mps = instance.mps.as_dict() if instance.mps is not None else None
            found.append((profile.id, instance.start, json.dumps(mps, sort_keys=True)))
        return sorted(found)

    wanted = ids(layout)
    return wanted is not None and ids(now) == wanted


def _check_layout(gpu: Gpu, layout: LayoutSpec) -> str | None:
    """Why the layout cannot be applied to this GPU (its product's rules), or ``None``. Runs
    the real service in a savepoint that is rolled back, replicas set aside as a drain would."""
    sid = transaction.savepoint()
    try:
        Allocation.objects.filter(gpu=gpu).delete()
        gpu_set_layout(gpu_id=gpu.pk, spec=layout)
        return None
    except ServiceError as error:
        return error.message
    finally:
        transaction.savepoint_rollback(sid)


Layouts = LayoutSpec | Mapping[int, LayoutSpec]
"""One layout for every selected GPU, or one per GPU id (selected GPUs without one are left
alone)."""


def _layout_for(layouts: Layouts, gpu_id: int) -> LayoutSpec | None:
    if isinstance(layouts, LayoutSpec):
        return layouts
    return layouts.get(gpu_id)


def _plan(selector: Selector, layouts: Layouts) -> tuple[list[dict[str, Any]], list[str]]:
    gpus, problems = [], []
    for gpu in selected_gpus(selector)[: MAX_GPUS + 1]:
        layout = _layout_for(layouts, gpu.pk)
        if layout is None or _same_layout(gpu, layout):
            continue
        why = _check_layout(gpu, layout)
        if why is not None:
            problems.append(f"{gpu}: {why}")
            continue
        gpus.append(gpu)
    if len(gpus) > MAX_GPUS:
        raise ServiceError(
            "rollout.too_many_gpus",
            f"The selector picks more than {MAX_GPUS} GPUs; narrow it.",
            {"max": MAX_GPUS},
        )
    return [_gpu_entry(gpu) for gpu in gpus], problems


def _gpu_entry(gpu: Gpu) -> dict[str, Any]:
    replicas = []
    for allocation in Allocation.objects.placed().filter(gpu=gpu).select_related("deployment"):
        ranking = deployment_ranking(allocation.deployment)
        elsewhere = any(gpu.pk not in (t.gpu_ids or (t.gpu_id,)) for t in ranking.feasible)
        replicas.append(
            {
                "allocation": allocation.pk,
                "replica": f"{allocation.deployment.name}[{allocation.replica}]",
                "has_room_elsewhere": elsewhere,
            }
        )
    return {"gpu": gpu.pk, "label": str(gpu), "replicas": replicas}


def _check_targets(selector: Selector, layouts: Layouts) -> None:
    """Per-GPU layouts name only GPUs the selector picks (a typo must not widen a rollout)."""
    if isinstance(layouts, LayoutSpec):
        return
    if not layouts:
        raise ServiceError("rollout.invalid", "'layouts' names no GPU.", {"field": "layouts"})
    picked = set(selected_gpus(selector).filter(pk__in=list(layouts)).values_list("pk", flat=True))
    outside = sorted(set(layouts) - picked)
    if outside:
        raise ServiceError(
            "rollout.gpu_not_selected",
            f"'layouts' names {len(outside)} GPU(s) the selector does not pick: "
            f"{', '.join(map(str, outside[:20]))}.",
            {"field": "layouts", "gpus": outside[:100]},
        )


def _payload_layouts(layouts: Layouts) -> dict[str, Any]:
    if isinstance(layouts, LayoutSpec):
        return {"layout": layouts.as_json()}
    return {"layout": None, "layouts": {str(k): v.as_json() for k, v in layouts.items()}}


@transaction.atomic
def layout_rollout_start(
    *,
    selector: Selector,
    layout: Layouts,
    max_unavailable: int = 1,
    timeout_s: float = 600.0,
    dry_run: bool = False,
    requested_by: Any = None,
    place_waiting: tuple[int, ...] = (),
) -> dict[str, Any] | Operation:
    """Start a rollout (an operation), or with ``dry_run`` answer what it would do.

    ``layout``: one layout for every selected GPU, or a layout per GPU id (each a GPU the
    selector picks). ``place_waiting``: deployments whose unplaced replicas the engine places
    once every GPU is reshaped (the layout advisor's proposal names them)."""
    if not 1 <= max_unavailable <= MAX_UNAVAILABLE:
        raise ServiceError(
            "rollout.invalid",
            f"'max_unavailable' must be from 1 to {MAX_UNAVAILABLE}.",
            {"field": "max_unavailable"},
        )
    if not (selector.product or selector.labels or selector.hosts or selector.gpus):
        raise ServiceError(
            "rollout.selector_required",
            "Give a selector: a product, host labels, hosts or GPUs (never the whole fleet by "
            "accident).",
            {"field": "selector"},
        )
    _check_targets(selector, layout)
    gpus, problems = _plan(selector, layout)
    if dry_run:
        return {
            "gpus": gpus,
            "problems": problems,
            "replicas_to_move": sum(len(g["replicas"]) for g in gpus),
            "replicas_without_room": sum(
                1 for g in gpus for r in g["replicas"] if not r["has_room_elsewhere"]
            ),
        }
    if problems:
        raise ServiceError(
            "rollout.layout_invalid",
            f"The layout does not fit {len(problems)} selected GPU(s): {problems[0]}",
            {"problems": problems[:20]},
        )
    if not gpus:
        raise Conflict(
            "rollout.nothing_to_do",
            "Every selected GPU already has this layout (or the selector picks none).",
            {"selector": selector.as_json()},
        )
    operation = operation_record(
        kind=OperationKind.LAYOUT_ROLLOUT,
        summary=f"Layout rollout to {len(gpus)} GPU(s), {max_unavailable} at a time",
        requested_by=requested_by,
        status=OperationStatus.DISPATCHED,
        payload={
            "selector": selector.as_json(),
            **_payload_layouts(layout),
            "max_unavailable": max_unavailable,
            "timeout_s": timeout_s,
            "place_waiting": list(place_waiting),
            "pending": [g["gpu"] for g in gpus],
            "draining": {},
            "done": [],
            "paused": None,
            "log": [{"note": f"{len(gpus)} GPU(s) to reshape", "at": timezone.now().isoformat()}],
        },
    )
    advance_after_commit(operation.pk)
    return operation


def layout_rollout_advance(*, operation_id: int) -> str:
    """Move the rollout on: collect finished drains, start the next wave. Returns ``running``,
    ``paused`` or ``done``."""
    with transaction.atomic():
        operation = operation_lock_running(operation_id, OperationKind.LAYOUT_ROLLOUT)
        if operation is None:
            return "done"
        payload = dict(operation.payload)
        for key, drain_id in list(payload["draining"].items()):
            drain = Operation.objects.filter(pk=drain_id).first()
            if drain is not None and drain.status in RUNNING:
                continue
            del payload["draining"][key]
            if drain is not None and drain.status == OperationStatus.SUCCEEDED:
                payload["done"].append(int(key))
            else:
                reason = drain.reason if drain is not None else "its drain vanished"
                payload["pending"].insert(0, int(key))  # tried again on resume
                if payload["paused"] is None:
                    payload["paused"] = f"GPU {key}: {reason}"
                    _log(payload, f"paused: GPU {key}: {reason}")
        if payload["paused"] is None and not payload.get("aborted"):
            _start_wave(operation, payload)
        if not payload["draining"] and (not payload["pending"] or payload.get("aborted")):
            return _finish(operation, payload)
        operation.payload = payload
        operation.save(update_fields=["payload", "updated_at"])
        publish_changed("operation", [operation.pk])
        return "paused" if payload["paused"] else "running"


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


def _start_wave(operation: Operation, payload: dict[str, Any]) -> None:
    while payload["pending"] and len(payload["draining"]) < payload["max_unavailable"]:
        gpu_id = int(payload["pending"][0])
        gpu = Gpu.objects.filter(pk=gpu_id).first()
        layout = _stored_layout(payload, gpu_id)
        if gpu is None or layout is None or _same_layout(gpu, layout):
            payload["pending"].pop(0)
            if gpu is not None:
                payload["done"].append(gpu_id)
            continue
        reshape = _reshape_in_place(gpu, layout, operation.requested_by)
        if reshape is not None:
            payload["pending"].pop(0)
            payload["draining"][str(gpu_id)] = reshape.pk
            _log(payload, f"reshaping GPU {gpu_id} in place (operation {reshape.pk})")
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
            _log(payload, f"paused: {payload['paused']}")
            return
        payload["pending"].pop(0)
        payload["draining"][str(gpu_id)] = drain.pk
        _log(payload, f"draining GPU {gpu_id} (operation {drain.pk})")


def _place_waiting(payload: dict[str, Any]) -> None:
    """Place the waiting replicas of the deployments the rollout names, one at a time, as many
    as fit (each in its own savepoint: one that fits nowhere leaves the others placed)."""
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
        _log(payload, f"placed {placed} waiting replica(s)")


def _finish(operation: Operation, payload: dict[str, Any]) -> str:
    aborted = payload.get("aborted")
    if not aborted:
        _place_waiting(payload)
    status = OperationStatus.FAILED if aborted else OperationStatus.SUCCEEDED
    reason = (
        f"aborted by an operator after {len(payload['done'])} GPU(s)"
        if aborted
        else f"{len(payload['done'])} GPU(s) reshaped"
    )
    _log(payload, reason)
    Operation.objects.filter(pk=operation.pk).update(
        status=status,
        reason=reason,
        payload=payload,
        finished_at=timezone.now(),
        updated_at=timezone.now(),
    )
    alert_operation_ended(operation, status=status, reason=reason)
    publish_changed("operation", [operation.pk])
    return "done"


def _log(payload: dict[str, Any], note: str) -> None:
    payload["log"] = [*payload.get("log", []), {"note": note, "at": timezone.now().isoformat()}]


def _locked(operation_id: int) -> Operation:
    operation = (
        Operation.objects.select_for_update()
        .filter(pk=operation_id, kind=OperationKind.LAYOUT_ROLLOUT)
        .first()
    )
    if operation is None:
        raise NotFound(
            "rollout.not_found",
            f"Layout rollout {operation_id} does not exist.",
            {"rollout": operation_id},
        )
    if operation.status not in RUNNING:
        raise Conflict(
            "rollout.finished",
            f"Layout rollout {operation_id} has finished ({operation.status}).",
            {"status": operation.status},
        )
    return operation


@transaction.atomic
def layout_rollout_resume(*, operation_id: int, requested_by: Any = None) -> Operation:
    """Resume a paused rollout: the GPU that failed is tried again first."""
    operation = _locked(operation_id)
    if operation.payload.get("paused") is None:
        raise Conflict("rollout.not_paused", "This rollout is not paused.", {})
    payload = dict(operation.payload)
    _log(payload, f"resumed (was: {payload['paused']})")
    payload["paused"] = None
    operation.payload = payload
    operation.save(update_fields=["payload", "updated_at"])
    advance_after_commit(operation_id)
    return operation


@transaction.atomic
def layout_rollout_abort(*, operation_id: int, requested_by: Any = None) -> Operation:
    """Stop a rollout: drains under way finish (each rolls back on its own failure), no new one
    starts."""
    operation = _locked(operation_id)
    payload = dict(operation.payload, aborted=True)
    _log(payload, "abort asked")
    operation.payload = payload
    operation.save(update_fields=["payload", "updated_at"])
    advance_after_commit(operation_id)
    return operation


def layout_rollouts_advance() -> list[str]:
    """Advance every running layout rollout (after acks and reports, and from beat)."""
    running = Operation.objects.filter(kind=OperationKind.LAYOUT_ROLLOUT, status__in=RUNNING)
    return [layout_rollout_advance(operation_id=pk) for pk in running.values_list("pk", flat=True)]
