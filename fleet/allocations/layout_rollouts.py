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

One ``layout_rollout`` operation holds it in its ``payload``: this module plans, starts, resumes
and aborts it; the layout rollout workflow (:mod:`fleet.workflows.layout_rollouts`) moves it on.
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

from fleet.allocations.models import Allocation
from fleet.allocations.rankings import deployment_ranking
from fleet.core.errors import Conflict, NotFound, ServiceError
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import RUNNING, operation_record
from fleet.inventory.models import Gpu
from fleet.partitioning import converters
from fleet.partitioning.selectors import current_layout
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


def same_layout(gpu: Gpu, layout: LayoutSpec) -> bool:
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
        if layout is None or same_layout(gpu, layout):
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
            "step": "rolling",
            "log": [{"note": f"{len(gpus)} GPU(s) to reshape", "at": timezone.now().isoformat()}],
        },
    )
    advance_after_commit(operation.pk)
    return operation


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
