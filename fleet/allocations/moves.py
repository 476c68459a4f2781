"""Moves, make before break: a running replica gets a new copy on the target, and the old copy
is stopped only once the new one runs (its health check passing, when it has one).

One ``move`` operation carries the steps in its ``payload``:

1. **reserve** the target (the placement engine's verdict, under the same locks as ``place``)
   and write the new copy's allocation beside the old one (``Allocation.replaces``);
2. **start**: the target's agent is sent the new copy and starts it;
3. **wait** until the agent reports it ``running``;
4. **switch**: release the old copy's slice (its workload is stopped first, as on eviction) and
   the new copy becomes the replica.

A failure at any step (the new copy fails, crash-loops or exits; the deadline passes; someone
evicts it) releases the target and leaves the old copy running. A replica whose workload Fleet
does not run (runtime ``none``) has nothing to wait for: its slice moves at once, and the outside
launcher must restart it there. The move workflow (:mod:`fleet.workflows.moves`) advances it:
after each workload report of the target's host, and from beat.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import timedelta
from enum import StrEnum
from typing import Any, NotRequired

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.allocations.autoplace import violations_of
from fleet.allocations.models import Allocation, AllocationState
from fleet.allocations.move_copies import (
    copy_ids,
    copy_of,
    copy_rollback,
    copy_rows,
    copy_switch,
)
from fleet.allocations.quotas import QuotaExceeded, move_quota_check
from fleet.allocations.rankings import deployment_ranking
from fleet.allocations.reservations import reserve_target
from fleet.allocations.services import lock_deployment
from fleet.allocations.workloads import runtime_of
from fleet.core.errors import Conflict, NotFound, RuleViolation, ServiceError
from fleet.core.events import publish_changed
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import (
    RUNNING,
    WorkflowPayload,
    operation_finish,
    operation_record,
    operation_step,
)
from fleet.inventory.models import AgentRuntime
from fleet.partitioning.desired import schedule_push
from fleet.partitioning.models import Partition

logger = logging.getLogger(__name__)

# A stale ranking can make the first choices fail under the locks, as in auto-placement.
MAX_ATTEMPTS = 5


UNRUN_NOTE = (
    "the slice moved at once: Fleet does not run this replica's workload, so its launcher must "
    "start it on the new slice"
)


class MoveStep(StrEnum):
    """Where a move is (``payload["step"]``)."""

    WAIT_RUNNING = "wait_running"
    DONE = "done"
    FAILED = "failed"


class MovePayload(WorkflowPayload):
    """A move's payload (fleet.workflows.moves advances it)."""

    replica: int
    from_allocations: list[int]
    to_allocations: list[int]
    from_allocation: int
    from_partition: int | None
    from_gpu: int
    to_allocation: int
    to_partition: int | None
    to_gpu: int
    created_partition: Any
    make_before_break: bool
    timeout_s: float
    running_at: NotRequired[str]


def _timeout_s() -> float:
    return float(getattr(settings, "FLEET_MOVE_TIMEOUT_SECONDS", 300.0))


@transaction.atomic
def allocation_move(
    *,
    allocation_id: int,
    partition_id: int | None = None,
    gpu_id: int | None = None,
    start: int | None = None,
    timeout_s: float | None = None,
    workload: Any = None,
    over_quota_reason: str | None = None,
    requested_by: Any = None,
) -> Operation:
    """Start moving one replica to a partition or a GPU; returns the ``move`` operation.

    The new copy runs what the old one runs, or ``workload`` (a rolling update's new version:
    checked by the caller). While it runs beside the old copy it counts against the team's
    quota unless it is the team's one surge replica
    (:func:`fleet.allocations.quotas.move_quota_check`): :class:`QuotaExceeded` otherwise.
    ``over_quota_reason``: a move the fleet makes (a drain, a fault, repack, defragmentation),
    allowed past the quota and recorded as an ``over_quota`` operation."""
    if (partition_id is None) == (gpu_id is None):
        raise ServiceError("move.target_required", "Give exactly one of 'partition' or 'gpu'.")
    deployment_id = (
        Allocation.objects.filter(pk=allocation_id).values_list("deployment_id", flat=True).first()
    )
    if deployment_id is None:
        raise NotFound(
            "allocation.not_found",
            f"Allocation {allocation_id} does not exist.",
            {"allocation": allocation_id},
        )
    deployment = lock_deployment(deployment_id)
    olds = copy_of(
        Allocation.objects.select_related("partition", "gpu__host").get(pk=allocation_id)
    )
    old = olds[0]
    _check_movable(olds)
    if len(olds) > 1 and partition_id is not None:
        raise ServiceError(
            "move.target_required",
            f"{deployment.name}[{old.replica}] spans {len(olds)} GPUs: give a 'gpu', and the "
            "engine takes the others beside it.",
        )
    if partition_id is not None:
        target_gpu = Partition.objects.filter(pk=partition_id).values_list("gpu_id", flat=True)
        found = target_gpu.first()
        if found is None:
            raise NotFound(
                "partition.not_found",
                f"Partition {partition_id} does not exist.",
                {"partition": partition_id},
            )
        gpu_id = found
        if partition_id == old.partition_id:
            raise Conflict(
                "move.same_target",
                f"{deployment.name}[{old.replica}] already runs on that partition.",
                {"partition": partition_id},
            )
    assert gpu_id is not None
    if deployment.kind != "mps" and partition_id is None and gpu_id in {a.gpu_id for a in olds}:
        raise Conflict(
            "move.same_target",
            f"{deployment.name}[{old.replica}] already runs on that GPU.",
            {"gpu": gpu_id},
        )
    move_quota_check(
        deployment=deployment,
        replica=old.replica,
        over_quota_reason=over_quota_reason,
        requested_by=requested_by,
    )
    gpu, news, created, generation = reserve_target(
        deployment,
        old.replica,
        gpu_id=gpu_id,
        partition_id=partition_id,
        start=start,
        conflict="move.conflict",
        replaces=olds,
        workload=workload if workload is not None else old.workload,
    )
    new = news[0]
    timeout = float(timeout_s if timeout_s is not None else _timeout_s())
    now = timezone.now()
    waits = runtime_of(deployment, new) != "none" and gpu.host.runtime != AgentRuntime.NONE
    operation = operation_record(
        kind=OperationKind.MOVE,
        summary=f"Move {deployment.name}[{old.replica}] from {old.partition} to {new.partition}",
        requested_by=requested_by,
        gpu=gpu,
        deployment=deployment,
        status=OperationStatus.DISPATCHED,
        payload=MovePayload(
            step=MoveStep.WAIT_RUNNING,
            log=[
                {
                    "step": "reserve",
                    "note": f"reserved {new.partition} (generation {generation})",
                    "at": now.isoformat(),
                }
            ],
            replica=old.replica,
            # A replica of several GPUs: every allocation of each copy, in slot order (the
            # first of each is the one that runs the workload, and ``*_allocation`` names it).
            from_allocations=[a.pk for a in olds],
            to_allocations=[a.pk for a in news],
            from_allocation=old.pk,
            from_partition=old.partition_id,
            from_gpu=old.gpu_id,
            to_allocation=new.pk,
            to_partition=new.partition_id,
            to_gpu=new.gpu_id,
            created_partition=created,
            make_before_break=waits,
            deadline=(now + timedelta(seconds=timeout)).isoformat(),
            timeout_s=timeout,
        ),
    )
    schedule_push(gpu.host_id)
    publish_changed("allocation", [a.pk for a in (*olds, *news)])
    if not waits:  # nothing to wait for: the slice moves now
        copy_switch(olds, news)
        _finish(operation, OperationStatus.SUCCEEDED, UNRUN_NOTE)
        operation.refresh_from_db()
        return operation
    advance_after_commit(operation.pk)
    return operation


def allocation_move_anywhere(
    *,
    allocation_id: int,
    reason: str = "",
    workload: Any = None,
    timeout_s: float | None = None,
    off_its_gpu: bool = True,
    avoid_gpus: Collection[int] = (),
    over_quota_reason: str | None = None,
    requested_by: Any = None,
) -> Operation:
    """Move one replica to the placement engine's best target (off its own GPU unless
    ``off_its_gpu`` is false: a rolling update's new copy may run beside the old one). Targets
    on ``avoid_gpus`` (a rollout's GPUs still to drain: the replica would move again) come after
    every other, in the engine's order. Raises :class:`RuleViolation` when no target takes
    it, :class:`QuotaExceeded` when the team's quota cannot count its new copy (as
    :func:`allocation_move`, with ``over_quota_reason``)."""
    allocation = Allocation.objects.select_related("deployment").get(pk=allocation_id)
    ranking = deployment_ranking(allocation.deployment)
    mine = {a.gpu_id for a in copy_of(allocation)}
    targets = [
        t
        for t in ranking.feasible
        if not off_its_gpu or not mine.intersection(t.gpu_ids or (t.gpu_id,))
    ]
    if avoid_gpus:
        avoid = set(avoid_gpus)
        targets.sort(key=lambda t: any(g in avoid for g in (t.gpu_ids or (t.gpu_id,))))
    refusals = [v for refusal in ranking.infeasible[:5] for v in refusal.violations]
    for target in targets[:MAX_ATTEMPTS]:
        try:
            with transaction.atomic():
                operation = allocation_move(
                    allocation_id=allocation_id,
                    partition_id=target.partition_id,
                    gpu_id=None if target.partition_id is not None else target.gpu_id,
                    start=target.new_instance.start if target.new_instance else None,
                    timeout_s=timeout_s,
                    workload=workload,
                    over_quota_reason=over_quota_reason,
                    requested_by=requested_by,
                )
        except QuotaExceeded:  # under the team's lock: no other target helps
            raise
        except (RuleViolation, Conflict) as error:  # taken meanwhile: the next target
            refusals.extend(violations_of(error))
            continue
        if reason:
            _note(operation, reason)
        return operation
    raise RuleViolation(
        f"No other GPU can take {allocation.deployment.name}[{allocation.replica}].",
        refusals[:20],
    )


def gpu_moves_start(
    *,
    gpu_id: int,
    reason: str,
    partitions: Collection[int] | None = None,
    avoid_gpus: Collection[int] = (),
) -> tuple[list[int], list[int]]:
    """A move for every replica on the GPU (or only on ``partitions`` of it) that has somewhere
    else to go, preferring GPUs not in ``avoid_gpus`` (one savepoint each: a refusal costs only
    that replica). The fleet's moves (a drain, a fault): allowed past a team's quota, recorded
    with ``reason``. Returns the move operations started and the allocations that have nowhere
    to go."""
    started, stuck = [], []
    staying = Allocation.objects.placed().filter(
        gpu_id=gpu_id, replaces__isnull=True, successor__isnull=True
    )
    if partitions is not None:
        staying = staying.filter(partition_id__in=list(partitions))
    for allocation_id in staying.values_list("pk", flat=True):
        try:
            with transaction.atomic():
                started.append(
                    allocation_move_anywhere(
                        allocation_id=allocation_id,
                        reason=reason,
                        avoid_gpus=avoid_gpus,
                        over_quota_reason=reason,
                    ).pk
                )
        except ServiceError as error:
            logger.info("allocation %s cannot move off GPU %s: %s", allocation_id, gpu_id, error)
            stuck.append(allocation_id)
    return started, stuck


def moves_cancel_onto(
    *, gpu_id: int, reason: str, partitions: Collection[int] | None = None
) -> list[int]:
    """Fail the running moves whose new copy is on ``gpu_id`` (or only on ``partitions`` of
    it: a reshape keeps the others) that a drain empties: their old copies keep running.
    Returns the operations failed."""
    cancelled = []
    arriving = Allocation.objects.filter(gpu_id=gpu_id, replaces__isnull=False)
    if partitions is not None:
        arriving = arriving.filter(partition_id__in=list(partitions))
    gone: set[int] = set()
    for new in arriving:
        if new.pk in gone:
            continue
        operation = next(
            (
                op
                for op in Operation.objects.select_for_update().filter(
                    kind=OperationKind.MOVE, status__in=RUNNING, deployment_id=new.deployment_id
                )
                if new.pk in copy_ids(op.payload, "to")
            ),
            None,
        )
        ids = copy_ids(operation.payload, "to") if operation is not None else [new.pk]
        copy = copy_rows(ids)  # a replica of several GPUs: the whole new copy goes
        copy_rollback(copy)
        gone.update(a.pk for a in copy)
        if operation is not None:
            _finish(operation, OperationStatus.FAILED, f"{reason}; the old copy keeps running")
            cancelled.append(operation.pk)
    return cancelled


def _check_movable(olds: list[Allocation]) -> None:
    old = olds[0]
    name = f"{old.deployment.name}[{old.replica}]"
    if any(a.state == AllocationState.RELEASING for a in olds):
        raise Conflict(
            "move.not_placed", f"{name} is being released: there is nothing to move.", {}
        )
    moving = any(a.replaces_id is not None for a in olds) or (
        Allocation.objects.filter(replaces__in=[a.pk for a in olds]).exists()
    )
    if moving:
        running = (
            Operation.objects.filter(kind=OperationKind.MOVE, status__in=RUNNING)
            .filter(deployment_id=old.deployment_id)
            .values_list("pk", flat=True)
            .first()
        )
        raise Conflict(
            "move.in_progress",
            f"{name} is already moving (operation {running}).",
            {"operation": running},
        )


def _note(operation: Operation, note: str, **extra: Any) -> None:
    operation_step(operation, note, **extra)


def _finish(operation: Operation, status: str, reason: str) -> None:
    operation_finish(operation, status, reason, done=MoveStep.DONE, failed=MoveStep.FAILED)
