"""Drain and reshape one GPU at a time: cordon it, move its replicas make before break (each new
copy runs elsewhere before the old one stops; what cannot move that way is stopped and placed
again), wait until the agent confirms it is idle, apply the new layout, verify it, uncordon. If
applying fails, roll back to the previous layout. Whole-node drains are what the GPU Operator
asks for; this is per GPU.

The workflow is one ``drain`` operation whose ``payload`` records each step; ``drain_advance``
moves it forward and is safe to call any time (on commit, on every agent ack, from beat).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import timedelta
from enum import StrEnum
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.allocations.health import replace_allocations
from fleet.allocations.models import Allocation
from fleet.allocations.moves import gpu_moves_start, moves_cancel_onto
from fleet.core.errors import Conflict, ServiceError
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import (
    RUNNING,
    operation_finish,
    operation_lock_running,
    operation_record,
    operation_step,
)
from fleet.inventory.models import Gpu, Host, SharingMode
from fleet.partitioning import converters
from fleet.partitioning.desired import lock_gpu
from fleet.partitioning.models import PartitionKind
from fleet.partitioning.services import (
    LayoutSpec,
    MigInstanceSpec,
    gpu_set_cordon,
    gpu_set_layout,
    layout_disturbed_partitions,
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


# Rounds of moves before what is left is stopped and placed again: a move is cancelled when its
# target starts draining too (a rollout's next GPU), and the replica can often go elsewhere.
MOVE_ROUNDS = 3


def layout_to_payload(spec: LayoutSpec | None) -> dict[str, Any] | None:
    return spec.as_json() if spec is not None else None


def layout_from_payload(raw: dict[str, Any]) -> LayoutSpec:
    return LayoutSpec.from_json(raw)


def current_layout(gpu: Gpu) -> LayoutSpec:
    """The GPU's desired layout now, as a spec that recreates it."""
    partitions = list(gpu.partitions.all())
    if gpu.mode == SharingMode.MIG:
        return LayoutSpec(
            mode="mig",
            instances=tuple(
                MigInstanceSpec(
                    profile=int(p.profile_id or 0),
                    start=p.start,
                    mps=converters.mps_policy(p) if p.mps_enabled else None,
                )
                for p in partitions
                if p.kind == PartitionKind.MIG
            ),
        )
    whole = next((p for p in partitions if p.kind == PartitionKind.GPU), None)
    if gpu.mode == SharingMode.MPS and whole is not None:
        return LayoutSpec(mode="mps", mps=converters.mps_policy(whole))
    return LayoutSpec(mode=gpu.mode)


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
    running = Operation.objects.filter(
        kind=OperationKind.DRAIN, gpu=gpu, status__in=RUNNING
    ).first()
    if running is not None:
        raise Conflict(
            "drain.in_progress",
            f"{gpu} is already draining (operation {running.pk}).",
            {"operation": running.pk},
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
        payload={
            "step": DrainStep.CORDON,
            "log": [],
            "layout": layout_to_payload(layout),
            "previous_layout": layout_to_payload(current_layout(gpu)),
            "was_cordoned": gpu.cordoned,
            "avoid_gpus": sorted(set(avoid_gpus) - {gpu.pk}),
            "deadline": (now + timedelta(seconds=timeout_s)).isoformat(),
            "timeout_s": timeout_s,
        },
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


def _step(operation: Operation, step: str, note: str, **extra: Any) -> None:
    operation_step(operation, note, step=step, **extra)


def _finish(operation: Operation, status: str, reason: str) -> None:
    operation_finish(operation, status, reason, done=DrainStep.DONE, failed=DrainStep.FAILED)


def drain_advance(*, operation_id: int) -> str:
    """Move the drain forward as far as it can go now; returns the step it is at."""
    with transaction.atomic():
        operation = operation_lock_running(operation_id)
        if operation is None:
            return DrainStep.DONE
        try:
            return _advance(operation)
        except ServiceError as error:
            _rollback_or_fail(operation, f"{error.message}")
            return DrainStep.FAILED


def _advance(operation: Operation) -> str:
    assert operation.gpu_id is not None
    gpu = Gpu.objects.select_related("host").get(pk=operation.gpu_id)
    step = operation.payload["step"]
    if step == DrainStep.CORDON:
        if not gpu.cordoned:
            gpu_set_cordon(
                gpu_id=gpu.pk, cordoned=True, reason=f"draining (operation {operation.pk})"
            )
        _step(operation, DrainStep.MOVE, "cordoned")
        # Commit the cordon (and release the host's lock) before moving: a move locks the
        # deployment, then hosts, as placement does; holding this host across it would take
        # the locks in the opposite order and could deadlock with a concurrent place.
        drain_advance_later(operation.pk)
        return DrainStep.MOVE
    if step == DrainStep.MOVE:
        why = f"draining {gpu} (operation {operation.pk})"
        # A reshape moves only the replicas whose partitions it destroys or re-polices, and
        # cancels only the moves arriving there.
        disturbed = _disturbed(gpu, operation.payload["layout"])
        cancelled = moves_cancel_onto(
            gpu_id=gpu.pk, reason=f"{gpu} is draining", partitions=disturbed
        )
        moves, _ = gpu_moves_start(
            gpu_id=gpu.pk,
            reason=why,
            partitions=disturbed,
            avoid_gpus=operation.payload.get("avoid_gpus", ()),
        )
        kept = "" if disturbed is None else f" ({_kept_note(gpu, disturbed)})"
        _step(
            operation,
            DrainStep.WAIT_MOVES,
            f"{len(moves)} replica(s) moving, make before break{kept}"
            + (f"; {len(cancelled)} move(s) onto it cancelled" if cancelled else ""),
            move_operations=moves,
            move_rounds=1,
            disturbed=None if disturbed is None else sorted(disturbed),
        )
        step = DrainStep.WAIT_MOVES
    disturbed_ids = operation.payload.get("disturbed")
    if step == DrainStep.WAIT_MOVES:
        moving = Operation.objects.filter(
            pk__in=operation.payload["move_operations"], status__in=RUNNING
        ).count()
        if moving:
            return _check_deadline(
                operation, f"{moving} move(s) waiting for their new copies to run"
            )
        rounds = int(operation.payload.get("move_rounds", MOVE_ROUNDS))
        if rounds < MOVE_ROUNDS and _still_here(gpu.pk, disturbed_ids):
            why = f"draining {gpu} (operation {operation.pk})"
            moves, _ = gpu_moves_start(
                gpu_id=gpu.pk,
                reason=why,
                partitions=disturbed_ids,
                avoid_gpus=operation.payload.get("avoid_gpus", ()),
            )
            if moves:
                _step(
                    operation,
                    DrainStep.WAIT_MOVES,
                    f"{len(moves)} replica(s) moving again (a move failed or its target "
                    "started draining)",
                    move_operations=moves,
                    move_rounds=rounds + 1,
                )
                return _check_deadline(operation, f"{len(moves)} move(s) under way")
        # What could not move that way (no target, a failed move): stopped and placed again.
        moved = replace_allocations(
            gpu_id=gpu.pk,
            reason=f"draining {gpu} (operation {operation.pk})",
            partitions=disturbed_ids,
        )
        host = Host.objects.get(pk=gpu.host_id)
        _step(
            operation,
            DrainStep.WAIT_IDLE,
            f"{len(moved)} replica(s) stopped and placed again",
            wait_generation=host.desired_generation,
            replace_operations=moved,
        )
        step = DrainStep.WAIT_IDLE
    if step == DrainStep.WAIT_IDLE:
        host = Host.objects.get(pk=gpu.host_id)
        if host.applied_generation < operation.payload["wait_generation"]:
            return _check_deadline(
                operation,
                f"the agent has not confirmed {gpu} is idle "
                f"(generation {operation.payload['wait_generation']} not acknowledged)",
            )
        stopping_qs = Allocation.objects.filter(gpu_id=gpu.pk)
        if disturbed_ids is not None:
            stopping_qs = stopping_qs.filter(partition_id__in=disturbed_ids)
        stopping = stopping_qs.count()
        if stopping:
            return _check_deadline(operation, f"{stopping} workload(s) on {gpu} still stopping")
        if operation.payload["layout"] is None:
            _finish(operation, OperationStatus.SUCCEEDED, f"{gpu} is drained and stays cordoned")
            return DrainStep.DONE
        reshape = gpu_set_layout(
            gpu_id=gpu.pk,
            spec=layout_from_payload(operation.payload["layout"]),
            requested_by=operation.requested_by,
        )
        _step(
            operation,
            DrainStep.WAIT_APPLY,
            "new layout sent to the agent",
            layout_operation=reshape.pk,
        )
        step = DrainStep.WAIT_APPLY
    if step == DrainStep.WAIT_APPLY:
        reshape = Operation.objects.get(pk=operation.payload["layout_operation"])
        if reshape.status in RUNNING:
            return _check_deadline(operation, f"the agent has not applied the new layout of {gpu}")
        if reshape.status != OperationStatus.SUCCEEDED:
            _rollback_or_fail(operation, f"applying the new layout failed: {reshape.reason}")
            return DrainStep.ROLLBACK
        _uncordon(operation, gpu)
        _finish(
            operation, OperationStatus.SUCCEEDED, f"{gpu} reshaped, verified and back in service"
        )
        return DrainStep.DONE
    if step == DrainStep.ROLLBACK:
        back = Operation.objects.get(pk=operation.payload["rollback_operation"])
        if back.status in RUNNING:
            return DrainStep.ROLLBACK
        _uncordon(operation, gpu)
        outcome = (
            "rolled back to the previous layout"
            if back.status == OperationStatus.SUCCEEDED
            else f"rollback failed too: {back.reason}"
        )
        _finish(operation, OperationStatus.FAILED, f"{operation.payload['failure']}; {outcome}")
        return DrainStep.FAILED
    return str(step)


def _disturbed(gpu: Gpu, layout: dict[str, Any] | None) -> set[int] | None:
    """The partitions a reshape to ``layout`` must empty; ``None``: all (a plain drain)."""
    if layout is None:
        return None
    return layout_disturbed_partitions(gpu_id=gpu.pk, spec=layout_from_payload(layout))


def _kept_note(gpu: Gpu, disturbed: set[int]) -> str:
    kept = (
        Allocation.objects.placed()
        .filter(gpu_id=gpu.pk)
        .exclude(partition_id__in=list(disturbed))
        .count()
    )
    return f"{kept} replica(s) stay: their partitions are kept" if kept else "none stays"


def _still_here(gpu_id: int, partitions: list[int] | None) -> bool:
    """Replicas still placed on what the drain empties, with no move under way."""
    left = Allocation.objects.placed().filter(
        gpu_id=gpu_id, replaces__isnull=True, successor__isnull=True
    )
    if partitions is not None:
        left = left.filter(partition_id__in=partitions)
    return left.exists()


def _check_deadline(operation: Operation, waiting_for: str) -> str:
    deadline = parse_datetime(operation.payload["deadline"])
    if deadline is not None and timezone.now() > deadline:
        _rollback_or_fail(
            operation, f"stuck for {int(operation.payload['timeout_s'])} s: {waiting_for}"
        )
        return DrainStep.FAILED
    if operation.payload.get("waiting_for") != waiting_for:
        _step(
            operation, operation.payload["step"], f"waiting: {waiting_for}", waiting_for=waiting_for
        )
    return str(operation.payload["step"])


def _rollback_or_fail(operation: Operation, failure: str) -> None:
    assert operation.gpu_id is not None
    gpu = Gpu.objects.get(pk=operation.gpu_id)
    if (
        operation.payload.get("layout_operation")
        and operation.payload.get("step") != DrainStep.ROLLBACK
    ):
        back = gpu_set_layout(
            gpu_id=gpu.pk, spec=layout_from_payload(operation.payload["previous_layout"])
        )
        _step(
            operation,
            DrainStep.ROLLBACK,
            f"{failure}; rolling back",
            failure=failure,
            rollback_operation=back.pk,
        )
        if back.status == OperationStatus.SUCCEEDED:  # nothing to undo on the agent
            drain_advance_later(operation.pk)
        return
    _uncordon(operation, gpu)
    _finish(operation, OperationStatus.FAILED, failure)


def _uncordon(operation: Operation, gpu: Gpu) -> None:
    if not operation.payload.get("was_cordoned") and Gpu.objects.get(pk=gpu.pk).cordoned:
        gpu_set_cordon(gpu_id=gpu.pk, cordoned=False)


def drain_advance_later(operation_id: int) -> None:
    advance_after_commit(operation_id)


def drains_advance(host_id: int | None = None) -> list[str]:
    """Advance every running drain (of one host): after an ack, and from beat."""
    running = Operation.objects.filter(kind=OperationKind.DRAIN, status__in=RUNNING)
    if host_id is not None:
        running = running.filter(host_id=host_id)
    return [drain_advance(operation_id=pk) for pk in running.values_list("pk", flat=True)]
