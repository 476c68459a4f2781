"""Drain and reshape one GPU at a time: cordon it, move (or stop) its replicas, wait until the
agent confirms it is idle, apply the new layout, verify it, uncordon. If applying fails, roll
back to the previous layout. Whole-node drains are what the GPU Operator asks for; this is per GPU.

The workflow is one ``drain`` operation whose ``payload`` records each step; ``drain_advance``
moves it forward and is safe to call any time (on commit, on every agent ack, from beat).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.allocations.health import replace_allocations
from fleet.core.errors import Conflict, ServiceError
from fleet.core.events import publish_changed
from fleet.inventory.models import Gpu, Host, SharingMode
from fleet.mps import MpsPolicy
from fleet.partitioning.models import Operation, OperationKind, OperationStatus, PartitionKind
from fleet.partitioning.services import (
    LayoutSpec,
    MigInstanceSpec,
    gpu_set_cordon,
    gpu_set_layout,
    lock_gpu,
    operation_record,
)

logger = logging.getLogger(__name__)

RUNNING = (OperationStatus.PENDING, OperationStatus.DISPATCHED)


def layout_to_payload(spec: LayoutSpec | None) -> dict[str, Any] | None:
    if spec is None:
        return None
    return {
        "mode": spec.mode,
        "instances": [
            {"profile": i.profile, "start": i.start, "mps": _policy_payload(i.mps)}
            for i in spec.instances
        ],
        "mps": _policy_payload(spec.mps),
    }


def layout_from_payload(raw: dict[str, Any]) -> LayoutSpec:
    return LayoutSpec(
        mode=raw["mode"],
        instances=tuple(
            MigInstanceSpec(profile=i["profile"], start=i["start"], mps=_policy(i.get("mps")))
            for i in raw["instances"]
        ),
        mps=_policy(raw.get("mps")),
    )


def _policy_payload(policy: MpsPolicy | None) -> dict[str, Any] | None:
    if policy is None:
        return None
    return {
        "default_active_thread_percentage": policy.default_active_thread_percentage,
        "default_pinned_mem_limit_mib": policy.default_pinned_mem_limit_mib,
        "max_clients": policy.max_clients,
    }


def _policy(raw: dict[str, Any] | None) -> MpsPolicy | None:
    return MpsPolicy(**raw) if raw is not None else None


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
                    mps=MpsPolicy(
                        p.mps_default_active_thread_percentage,
                        p.mps_default_pinned_mem_limit_mib,
                        p.mps_max_clients,
                    )
                    if p.mps_enabled
                    else None,
                )
                for p in partitions
                if p.kind == PartitionKind.MIG
            ),
        )
    whole = next((p for p in partitions if p.kind == PartitionKind.GPU), None)
    if gpu.mode == SharingMode.MPS and whole is not None:
        return LayoutSpec(
            mode="mps",
            mps=MpsPolicy(
                whole.mps_default_active_thread_percentage,
                whole.mps_default_pinned_mem_limit_mib,
                whole.mps_max_clients,
            ),
        )
    return LayoutSpec(mode=gpu.mode)


@transaction.atomic
def gpu_drain(
    *,
    gpu_id: int,
    layout: LayoutSpec | None = None,
    timeout_s: float = 300.0,
    requested_by: Any = None,
) -> Operation:
    """Start draining one GPU (and reshaping it to ``layout`` when given)."""
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
            "step": "cordon",
            "steps": [],
            "layout": layout_to_payload(layout),
            "previous_layout": layout_to_payload(current_layout(gpu)),
            "was_cordoned": gpu.cordoned,
            "deadline": (now + timedelta(seconds=timeout_s)).isoformat(),
            "timeout_s": timeout_s,
        },
    )
    transaction.on_commit(lambda: drain_advance(operation_id=operation.pk))
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
    payload = dict(operation.payload)
    payload["steps"] = [
        *payload.get("steps", []),
        {"step": payload.get("step"), "note": note, "at": timezone.now().isoformat()},
    ]
    payload.update(step=step, **extra)
    operation.payload = payload
    operation.save(update_fields=["payload", "updated_at"])
    publish_changed("operation", [operation.pk])


def _finish(operation: Operation, status: str, reason: str) -> None:
    payload = dict(operation.payload)
    payload["steps"] = [
        *payload.get("steps", []),
        {"step": payload.get("step"), "note": reason, "at": timezone.now().isoformat()},
    ]
    payload["step"] = "done" if status == OperationStatus.SUCCEEDED else "failed"
    Operation.objects.filter(pk=operation.pk).update(
        status=status, reason=reason[:2000], payload=payload, finished_at=timezone.now()
    )
    publish_changed("operation", [operation.pk])


def drain_advance(*, operation_id: int) -> str:
    """Move the drain forward as far as it can go now; returns the step it is at."""
    with transaction.atomic():
        operation = (
            Operation.objects.select_for_update()
            .filter(pk=operation_id, status__in=RUNNING)
            .first()
        )
        if operation is None:
            return "done"
        try:
            return _advance(operation)
        except ServiceError as error:
            _rollback_or_fail(operation, f"{error.message}")
            return "failed"


def _advance(operation: Operation) -> str:
    assert operation.gpu_id is not None
    gpu = Gpu.objects.select_related("host").get(pk=operation.gpu_id)
    step = operation.payload["step"]
    if step == "cordon":
        if not gpu.cordoned:
            gpu_set_cordon(
                gpu_id=gpu.pk, cordoned=True, reason=f"draining (operation {operation.pk})"
            )
        _step(operation, "move", "cordoned")
        step = "move"
    if step == "move":
        moved = replace_allocations(
            gpu_id=gpu.pk, reason=f"draining {gpu} (operation {operation.pk})"
        )
        host = Host.objects.get(pk=gpu.host_id)
        _step(
            operation,
            "wait_idle",
            f"{len(moved)} replica(s) moved or stopped",
            wait_generation=host.desired_generation,
            replace_operations=moved,
        )
        step = "wait_idle"
    if step == "wait_idle":
        host = Host.objects.get(pk=gpu.host_id)
        if host.applied_generation < operation.payload["wait_generation"]:
            return _check_deadline(
                operation,
                f"the agent has not confirmed {gpu} is idle "
                f"(generation {operation.payload['wait_generation']} not acknowledged)",
            )
        if operation.payload["layout"] is None:
            _finish(operation, OperationStatus.SUCCEEDED, f"{gpu} is drained and stays cordoned")
            return "done"
        reshape = gpu_set_layout(
            gpu_id=gpu.pk,
            spec=layout_from_payload(operation.payload["layout"]),
            requested_by=operation.requested_by,
        )
        _step(operation, "wait_apply", "new layout sent to the agent", layout_operation=reshape.pk)
        step = "wait_apply"
    if step == "wait_apply":
        reshape = Operation.objects.get(pk=operation.payload["layout_operation"])
        if reshape.status in RUNNING:
            return _check_deadline(operation, f"the agent has not applied the new layout of {gpu}")
        if reshape.status != OperationStatus.SUCCEEDED:
            _rollback_or_fail(operation, f"applying the new layout failed: {reshape.reason}")
            return "rollback"
        _uncordon(operation, gpu)
        _finish(
            operation, OperationStatus.SUCCEEDED, f"{gpu} reshaped, verified and back in service"
        )
        return "done"
    if step == "rollback":
        back = Operation.objects.get(pk=operation.payload["rollback_operation"])
        if back.status in RUNNING:
            return "rollback"
        _uncordon(operation, gpu)
        outcome = (
            "rolled back to the previous layout"
            if back.status == OperationStatus.SUCCEEDED
            else f"rollback failed too: {back.reason}"
        )
        _finish(operation, OperationStatus.FAILED, f"{operation.payload['failure']}; {outcome}")
        return "failed"
    return str(step)


def _check_deadline(operation: Operation, waiting_for: str) -> str:
    deadline = parse_datetime(operation.payload["deadline"])
    if deadline is not None and timezone.now() > deadline:
        _rollback_or_fail(
            operation, f"stuck for {int(operation.payload['timeout_s'])} s: {waiting_for}"
        )
        return "failed"
    if operation.payload.get("waiting_for") != waiting_for:
        _step(
            operation, operation.payload["step"], f"waiting: {waiting_for}", waiting_for=waiting_for
        )
    return str(operation.payload["step"])


def _rollback_or_fail(operation: Operation, failure: str) -> None:
    assert operation.gpu_id is not None
    gpu = Gpu.objects.get(pk=operation.gpu_id)
    if operation.payload.get("layout_operation") and operation.payload.get("step") != "rollback":
        back = gpu_set_layout(
            gpu_id=gpu.pk, spec=layout_from_payload(operation.payload["previous_layout"])
        )
        _step(
            operation,
            "rollback",
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
    transaction.on_commit(lambda: drain_advance(operation_id=operation_id))


def drains_advance(host_id: int | None = None) -> list[str]:
    """Advance every running drain (of one host): after an ack, and from beat."""
    running = Operation.objects.filter(kind=OperationKind.DRAIN, status__in=RUNNING)
    if host_id is not None:
        running = running.filter(host_id=host_id)
    return [drain_advance(operation_id=pk) for pk in running.values_list("pk", flat=True)]
