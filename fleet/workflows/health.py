"""Health that acts and recovers, as ECS Managed Instances does for MPS tasks.

Detection feeds in from agent events (Xid, ECC, MPS daemon, lost GPU). A sick GPU is marked
unhealthy and cordoned, and its replicas are re-placed on healthy capacity by the placement
engine at once, each step an operation. When the fault clears (the daemon answers again, the GPU
is back, a quiet period after an Xid, or an operator heals it) the GPU returns to service: never
"unhealthy forever". A host that stops answering is not a fault of this kind: its replicas wait
out a grace period (:mod:`fleet.workflows.offline`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.moves import gpu_moves_start
from fleet.allocations.services import deployment_evict
from fleet.core import alerts
from fleet.core.errors import NotFound, ServiceError
from fleet.core.events import publish_changed
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.inventory.models import Gpu, GpuHealth, HealthCause, HealthEvent
from fleet.partitioning.desired import host_bump_generation, schedule_push

logger = logging.getLogger(__name__)

# Xids that NVIDIA's k8s device plugin treats as application errors: the GPU stays healthy.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def xid_is_fatal(xid: int | None) -> bool:
    return xid is not None and xid not in APPLICATION_XIDS


def ecc_is_uncorrectable(detail: str) -> bool:
    """From the agent's ECC event: a count of uncorrected errors, or NVML's double-bit flag."""
    counted = re.search(r"(\d+) uncorrected", detail)
    if counted:
        return int(counted.group(1)) > 0
    flags = re.search(r"ECC event 0x([0-9a-fA-F]+)", detail)
    return bool(flags and int(flags.group(1), 16) & 0x2)


def on_event(event: HealthEvent) -> None:
    """Act on one recorded agent event."""
    gpu = event.gpu
    if gpu is None:
        return
    kind = event.kind
    if kind == "xid" and xid_is_fatal(event.xid):
        gpu_mark_unhealthy(
            gpu_id=gpu.pk, cause=HealthCause.XID, reason=f"Xid {event.xid} {event.detail}".strip()
        )
    elif kind == "ecc" and ecc_is_uncorrectable(event.detail):
        gpu_mark_unhealthy(gpu_id=gpu.pk, cause=HealthCause.ECC, reason=event.detail)
    elif kind == "mps_down":
        gpu_mark_unhealthy(
            gpu_id=gpu.pk, cause=HealthCause.MPS, reason=event.detail or "MPS daemon down"
        )
    elif kind == "gpu_lost":
        gpu_mark_unhealthy(
            gpu_id=gpu.pk,
            cause=HealthCause.LOST,
            reason=event.detail or "GPU lost",
            health=GpuHealth.LOST,
        )
    elif kind == "mps_up":
        gpu_recover(gpu_id=gpu.pk, causes=(HealthCause.MPS,), reason="MPS daemon answers again")
    elif kind == "gpu_back":
        gpu_recover(gpu_id=gpu.pk, causes=(HealthCause.LOST,), reason="GPU is back")


@transaction.atomic
def gpu_mark_unhealthy(
    *,
    gpu_id: int,
    cause: str,
    reason: str,
    health: str = GpuHealth.UNHEALTHY,
    requested_by: Any = None,
) -> Operation | None:
    """Mark the GPU unhealthy (or lost), cordon it, then re-place its replicas elsewhere."""
    gpu = Gpu.objects.select_for_update().select_related("host").get(pk=gpu_id)
    if gpu.health == health and gpu.health_cause == cause:
        return None  # already known: repeated events change nothing
    if gpu.health == GpuHealth.LOST and health != GpuHealth.LOST:
        return None  # a lost GPU stays lost until it is back
    gpu.health, gpu.health_cause, gpu.health_reason = health, cause, reason[:255]
    gpu.health_changed_at = timezone.now()
    if not gpu.cordoned:
        gpu.cordoned, gpu.auto_cordoned, gpu.cordon_reason = True, True, f"health: {reason}"[:255]
    gpu.save()
    operation = operation_record(
        kind=OperationKind.HEALTH,
        summary=f"{gpu} is {health}: {reason}"[:255],
        gpu=gpu,
        status=OperationStatus.SUCCEEDED,
        reason=reason,
        requested_by=requested_by,
        payload={"health": health, "cause": cause, "cordoned": gpu.cordoned},
    )
    alerts.alert_emit(
        event=alerts.GPU_UNHEALTHY,
        summary=f"{gpu} is {health}: {reason}",
        subject={**alerts.gpu_subject(gpu), "cause": cause, "health": health},
    )
    if cause == HealthCause.MPS:
        # Re-send the desired state: applying it restarts the daemon, and mps_up heals the GPU.
        host_bump_generation(gpu.host_id)
        schedule_push(gpu.host_id)
    why = f"{gpu} is {health}: {reason}"
    if cause == HealthCause.ECC:
        # The GPU still works: its replicas move make before break, and only those with
        # nowhere to go are stopped and placed again (they wait for capacity).
        transaction.on_commit(lambda: move_allocations(gpu_id=gpu_id, reason=why), robust=True)
    else:  # a dead GPU (or MPS daemon) runs nothing worth keeping: stop and start elsewhere
        transaction.on_commit(lambda: replace_allocations(gpu_id=gpu_id, reason=why), robust=True)
    return operation


def move_allocations(*, gpu_id: int, reason: str) -> list[int]:
    """Move the replicas off a GPU that still works (make before break); those that have
    nowhere to go are re-placed as on a dead GPU. Returns the operations recorded."""
    started, stuck = gpu_moves_start(gpu_id=gpu_id, reason=reason)
    replicas = sorted(
        set(Allocation.objects.filter(pk__in=stuck).values_list("deployment_id", "replica"))
    )
    return started + [_replace_one(d, r, reason) for d, r in replicas]


@transaction.atomic
def gpu_recover(
    *, gpu_id: int, causes: tuple[str, ...] | None = None, reason: str, requested_by: Any = None
) -> Operation | None:
    """Return the GPU to service when its fault has cleared (``causes``: which faults this clears;
    ``None`` for an operator's heal, which clears any)."""
    gpu = Gpu.objects.select_for_update().select_related("host").get(pk=gpu_id)
    if gpu.health == GpuHealth.HEALTHY or (causes is not None and gpu.health_cause not in causes):
        return None
    previous = gpu.health_reason
    gpu.health, gpu.health_cause, gpu.health_reason = GpuHealth.HEALTHY, HealthCause.NONE, ""
    gpu.health_changed_at = timezone.now()
    if gpu.auto_cordoned:
        gpu.cordoned, gpu.auto_cordoned, gpu.cordon_reason = False, False, ""
    gpu.save()
    alerts.alert_emit(
        event=alerts.GPU_RECOVERED,
        summary=f"{gpu} is back in service: {reason}",
        subject={**alerts.gpu_subject(gpu), "was": previous},
    )
    return operation_record(
        kind=OperationKind.HEALTH,
        summary=f"{gpu} is back in service: {reason}"[:255],
        gpu=gpu,
        status=OperationStatus.SUCCEEDED,
        reason=f"{reason} (was: {previous})",
        requested_by=requested_by,
        payload={"health": GpuHealth.HEALTHY, "cordoned": gpu.cordoned},
    )


def gpu_heal(*, gpu_id: int, requested_by: Any = None) -> Operation:
    """An operator returns a GPU to service (after a reset, say)."""
    if not Gpu.objects.filter(pk=gpu_id).exists():
        raise NotFound("gpu.not_found", f"GPU {gpu_id} does not exist.", {"gpu": gpu_id})
    operation = gpu_recover(
        gpu_id=gpu_id, reason="healed by an operator", requested_by=requested_by
    )
    if operation is None:
        raise ServiceError("gpu.already_healthy", "This GPU is healthy.", status_code=409)
    return operation


def replace_allocations(
    *,
    gpu_id: int | None = None,
    host_id: int | None = None,
    reason: str,
    partitions: Collection[int] | None = None,
) -> list[int]:
    """Move every replica off a sick GPU (or an offline host) onto healthy capacity.

    Each replica is evicted and placed again by the default strategy, one transaction per
    replica; a replica that fits nowhere stays pending and a failed ``replace`` operation says
    why. Returns the ids of the operations recorded.
    """
    if gpu_id is not None:
        allocations = Allocation.objects.placed().filter(gpu_id=gpu_id)
    else:
        assert host_id is not None
        allocations = Allocation.objects.placed().filter(gpu__host_id=host_id)
    if partitions is not None:  # only these partitions of the GPU (a reshape keeps the others)
        allocations = allocations.filter(partition_id__in=list(partitions))
    replicas = sorted(set(allocations.values_list("deployment_id", "replica")))
    recorded = []
    for deployment_id, replica in replicas:
        recorded.append(_replace_one(deployment_id, replica, reason))
    return recorded


def _replace_one(deployment_id: int, replica: int, reason: str) -> int:
    deployment = Deployment.objects.get(pk=deployment_id)
    with transaction.atomic():
        deployment_evict(deployment_id=deployment_id, replica=replica)
    try:
        with transaction.atomic():
            placed = deployment_autoplace(
                deployment_id=deployment_id, limit=1, over_quota_reason=reason
            )
        target = placed[0].summary if placed else "nowhere"
        return operation_record(
            kind=OperationKind.REPLACE,
            summary=f"Re-placed {deployment.name}[{replica}]: {target}"[:255],
            deployment=deployment,
            status=OperationStatus.SUCCEEDED,
            reason=reason,
            payload={"replica": replica, "placed": [op.pk for op in placed]},
        ).pk
    except ServiceError as error:
        logger.warning(
            "no healthy capacity for %s[%s]: %s", deployment.name, replica, error.message
        )
        return operation_record(
            kind=OperationKind.REPLACE,
            summary=f"Could not re-place {deployment.name}[{replica}]"[:255],
            deployment=deployment,
            status=OperationStatus.FAILED,
            reason=f"{reason}. No healthy capacity: {error.message}",
            payload={"replica": replica},
        ).pk


def gpus_recover_quiet(now: Any = None) -> list[int]:
    """GPUs made unhealthy by a fatal Xid come back after a quiet period with no new one."""
    now = now or timezone.now()
    quiet = timedelta(seconds=float(settings.FLEET_XID_RECOVERY_SECONDS))
    recovered = []
    for gpu in Gpu.objects.filter(health=GpuHealth.UNHEALTHY, health_cause=HealthCause.XID):
        last = HealthEvent.objects.filter(gpu=gpu, kind="xid").values_list("ts", flat=True).first()
        if (last is None or now - last >= quiet) and gpu_recover(
            gpu_id=gpu.pk,
            causes=(HealthCause.XID,),
            reason=f"no fatal Xid for {int(quiet.total_seconds())} s",
        ):
            recovered.append(gpu.pk)
    publish_changed("gpu", recovered)
    return recovered


def replicas_retry() -> list[int]:
    """Try again to place the replicas a fault left without capacity (beat).

    A failed ``replace`` operation whose replica is still unplaced is retried; success records
    a new ``replace`` operation and links it from the failed one, so nothing waits forever.
    """
    retried = []
    waiting = Operation.objects.filter(
        kind=OperationKind.REPLACE, status=OperationStatus.FAILED
    ).exclude(result__has_key="replaced_by")
    for failed in waiting.select_related("deployment").order_by("id")[:50]:
        deployment, replica = failed.deployment, failed.payload.get("replica")
        if deployment is None or replica is None or replica >= deployment.replicas:
            Operation.objects.filter(pk=failed.pk).update(
                result={**failed.result, "replaced_by": None}
            )
            continue
        if deployment.allocations.placed().filter(replica=replica).exists():
            Operation.objects.filter(pk=failed.pk).update(
                result={**failed.result, "replaced_by": None}
            )
            continue
        try:
            with transaction.atomic():
                placed = deployment_autoplace(
                    deployment_id=deployment.pk,
                    limit=1,
                    over_quota_reason=f"re-placing after a fault (operation {failed.pk})",
                )
                done = operation_record(
                    kind=OperationKind.REPLACE,
                    summary=f"Re-placed {deployment.name}[{replica}]: {placed[0].summary}"[:255],
                    deployment=deployment,
                    status=OperationStatus.SUCCEEDED,
                    reason=f"capacity came back (after operation {failed.pk})",
                    payload={
                        "replica": replica,
                        "placed": [op.pk for op in placed],
                        "retry_of": failed.pk,
                    },
                )
                Operation.objects.filter(pk=failed.pk).update(
                    result={**failed.result, "replaced_by": done.pk}
                )
            retried.append(done.pk)
        except ServiceError:
            continue
    return retried
