"""Delivery of desired state, the agent's side: push a host's document to its socket group,
send it straight down one socket, and complete or fail operations when the agent acknowledges.

State changes are compare-and-set on the host's generation counters
(:mod:`fleet.partitioning.delivery`), so duplicate or late acks and racing workers are harmless.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from fleet.agents.discovery import gpus_observed
from fleet.agents.documents import host_desired_state
from fleet.allocations.models import Allocation, AllocationState
from fleet.core.alerts import alert_operation_ended
from fleet.core.events import agent_group, publish, publish_changed
from fleet.core.models import FINAL_STATUSES, Operation, OperationStatus
from fleet.inventory.models import Gpu, Host
from fleet.partitioning.delivery import desired_state_dispatched
from fleet.workflows.registry import workflows_wake
from hostagent import protocol

logger = logging.getLogger(__name__)


def desired_state_push(*, host_id: int) -> bool:
    """Send the current generation to the agent's socket group; mark it dispatched.

    Safe to run twice or out of order: the dispatched generation only grows.
    """
    host = Host.objects.filter(pk=host_id).first()
    if host is None:
        return False
    document = host_desired_state(host)
    generation = document["generation"]
    if generation <= host.applied_generation:
        return False
    sent = publish(agent_group(host_id), "agent.desired_state", {"message": dict(document)})
    desired_state_dispatched(host_id=host_id, generation=generation)
    logger.debug("pushed generation %s to host %s (layer accepted: %s)", generation, host_id, sent)
    return sent


def desired_document(host_id: int) -> dict[str, Any]:
    """The current desired state, recorded as dispatched, to send straight down one socket (or
    answer one REST poll)."""
    document = host_desired_state(Host.objects.get(pk=host_id))
    desired_state_dispatched(host_id=host_id, generation=document["generation"])
    return dict(document)


def _failed_items(items: list[protocol.ItemResult]) -> dict[str, list[protocol.ItemResult]]:
    failed: dict[str, list[protocol.ItemResult]] = {}
    for item in items:
        if item["status"] != "ok":
            failed.setdefault(item["gpu_uuid"], []).append(item)
    return failed


def _reason(items: list[protocol.ItemResult]) -> str:
    parts = []
    for item in items:
        pids = f" (pids {', '.join(map(str, item['pids']))})" if item["pids"] else ""
        parts.append(f"{item['status']}: {item['message'] or item['key']}{pids}")
    return "; ".join(parts)[:2000]


@transaction.atomic
def agent_ack(*, host: Host, ack: protocol.Ack) -> list[int]:
    """Complete or fail the operations the acknowledged generation covers.

    An operation fails when an item on its GPU failed (``in_use`` with the PIDs, ``failed``,
    ``refused``, ``needs_reset``); the others succeed. Allocations up to that generation become
    active unless their GPU failed. Returns the ids of the operations finished.
    """
    generation = int(ack["generation"])
    host = Host.objects.select_for_update().get(pk=host.pk)
    if generation > host.desired_generation:
        logger.warning(
            "host %s acked generation %s beyond desired %s",
            host.pk,
            generation,
            host.desired_generation,
        )
        return []
    gpus_observed(host=host, gpus=ack["observed"])
    if generation > host.applied_generation:
        Host.objects.filter(pk=host.pk).update(
            applied_generation=generation, dispatch_attempts=0, last_seen_at=timezone.now()
        )
    failed = _failed_items(ack["items"])
    failed_gpu_ids = dict(Gpu.objects.filter(host=host, uuid__in=failed).values_list("pk", "uuid"))
    now = timezone.now()
    finished: list[int] = []
    open_ops = (
        Operation.objects.select_for_update()
        .filter(host=host, generation__lte=generation)
        .exclude(status__in=FINAL_STATUSES)
    )
    for operation in open_ops:
        uuid = failed_gpu_ids.get(operation.gpu_id) if operation.gpu_id else None
        if uuid is None and operation.gpu_id is None and failed:
            uuid = next(iter(failed))
        if uuid is not None:
            operation.status = OperationStatus.FAILED
            operation.reason = _reason(failed[uuid])
            operation.result = {"items": [dict(i) for i in failed[uuid]], "generation": generation}
        else:
            operation.status = OperationStatus.SUCCEEDED
            operation.result = {"generation": generation}
        operation.finished_at = now
        operation.save(update_fields=["status", "reason", "result", "finished_at", "updated_at"])
        alert_operation_ended(operation, status=operation.status, reason=operation.reason)
        finished.append(operation.pk)
    Allocation.objects.filter(
        gpu__host=host, generation__lte=generation, state=AllocationState.PENDING
    ).exclude(gpu_id__in=list(failed_gpu_ids)).update(state=AllocationState.ACTIVE)
    publish_changed("operation", finished)
    publish_changed("host", [host.pk])
    # Drains, defrags, repacks and layout rollouts wait for acks like this one.
    transaction.on_commit(lambda: workflows_wake("ack", host.pk), robust=True)
    publish_changed("gpu", list(Gpu.objects.filter(host=host).values_list("pk", flat=True)))
    return finished
