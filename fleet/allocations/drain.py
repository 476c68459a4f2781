"""Drain and reshape one GPU at a time: cordon it, move its replicas make before break (each new
copy runs elsewhere before the old one stops; what cannot move that way is stopped and placed
again), wait until the agent confirms it is idle, apply the new layout, verify it, uncordon. If
applying fails, roll back to the previous layout. Whole-node drains are what the GPU Operator
asks for; this is per GPU.

The workflow is one ``drain`` operation whose ``payload`` records each step; this module starts
it (:func:`gpu_drain`), and the drain workflow (:mod:`fleet.workflows.drain`) moves it forward.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import timedelta
from enum import StrEnum
from typing import Any, NotRequired

from django.db import transaction
from django.utils import timezone

from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import (
    WorkflowPayload,
    operation_record,
    operation_refuse_running,
)
from fleet.inventory.models import Gpu
from fleet.partitioning.desired import lock_gpu
from fleet.partitioning.selectors import current_layout
from fleet.partitioning.services import (
    LayoutSpec,
    gpu_set_layout,
)

logger = logging.getLogger(__name__)


class DrainStep(StrEnum):
    """Where a drain is (``payload["step"]``); the dashboard labels each one."""

    CORDON = "cordon"
    MOVE = "move"
    WAIT_MOVES = "wait_moves"
    WAIT_IDLE = "wait_idle"
    WAIT_APPLY = "wait_apply"
    ROLLBACK = "rollback"
    DONE = "done"
    FAILED = "failed"


class DrainPayload(WorkflowPayload):
    """A GPU drain's payload (fleet.workflows.drain advances it)."""

    layout: dict[str, Any] | None
    previous_layout: dict[str, Any] | None
    was_cordoned: bool
    avoid_gpus: list[int]
    timeout_s: float
    move_operations: NotRequired[list[int]]
    move_rounds: NotRequired[int]
    disturbed: NotRequired[list[int] | None]
    wait_generation: NotRequired[int]
    replace_operations: NotRequired[list[int]]
    layout_operation: NotRequired[int]
    rollback_operation: NotRequired[int]
    failure: NotRequired[str]


def layout_to_payload(spec: LayoutSpec | None) -> dict[str, Any] | None:
    return spec.as_json() if spec is not None else None


def layout_from_payload(raw: dict[str, Any]) -> LayoutSpec:
    return LayoutSpec.from_json(raw)


@transaction.atomic
def gpu_drain(
    *,
    gpu_id: int,
    layout: LayoutSpec | None = None,
    timeout_s: float = 300.0,
    avoid_gpus: Collection[int] = (),
    requested_by: Any = None,
) -> Operation:
    """Start draining one GPU (and reshaping it to ``layout`` when given). Its replicas move to
    GPUs not in ``avoid_gpus`` where they can (a rollout names the GPUs it will drain next)."""
    gpu = lock_gpu(gpu_id)
    operation_refuse_running(
        OperationKind.DRAIN,
        "drain.in_progress",
        f"{gpu} is already draining (operation {{operation}}).",
        gpu=gpu,
    )
    if layout is not None:
        _dry_run(gpu_id, layout)
    now = timezone.now()
    what = "Drain and reshape" if layout is not None else "Drain"
    operation = operation_record(
        kind=OperationKind.DRAIN,
        summary=f"{what} {gpu}",
        requested_by=requested_by,
        gpu=gpu,
        status=OperationStatus.DISPATCHED,
        payload=DrainPayload(
            step=DrainStep.CORDON,
            log=[],
            layout=layout_to_payload(layout),
            previous_layout=layout_to_payload(current_layout(gpu)),
            was_cordoned=gpu.cordoned,
            avoid_gpus=sorted(set(avoid_gpus) - {gpu.pk}),
            deadline=(now + timedelta(seconds=timeout_s)).isoformat(),
            timeout_s=timeout_s,
        ),
    )
    advance_after_commit(operation.pk)
    return operation


def _dry_run(gpu_id: int, layout: LayoutSpec) -> None:
    """Refuse an invalid target layout up front (the rules, not the busy partitions: those are
    what the drain is for). Runs the real service in a savepoint that is rolled back."""
    sid = transaction.savepoint()
    try:
        for partition_allocations in Gpu.objects.get(pk=gpu_id).partitions.all():
            partition_allocations.allocations.all().delete()
        gpu_set_layout(gpu_id=gpu_id, spec=layout)
    finally:
        transaction.savepoint_rollback(sid)
