"""Delivery of desired state to agents: push, record as dispatched, complete on ack, re-push
with backoff, expire what never completes.

State changes are compare-and-set on the host's generation counters, so duplicate or late acks
and racing workers are harmless.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from fleet.allocations.models import Allocation, AllocationState
from fleet.core.events import agent_group, publish, publish_changed
from fleet.inventory.models import Gpu, Host, HostStatus
from fleet.partitioning.models import FINAL_STATUSES, Operation, OperationStatus
from fleet.partitioning.selectors import host_desired_state
from hostagent import protocol

logger = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 60.0


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


def desired_state_dispatched(*, host_id: int, generation: int) -> None:
    """Record that ``generation`` went out; its pending operations become dispatched."""
    now = timezone.now()
    Host.objects.filter(pk=host_id, dispatched_generation__lte=generation).update(
        dispatched_generation=generation,
        dispatched_at=now,
        dispatch_attempts=F("dispatch_attempts") + 1,
    )
    dispatched = Operation.objects.filter(
        host_id=host_id, status=OperationStatus.PENDING, generation__lte=generation
    )
    ids = list(dispatched.values_list("pk", flat=True))
    dispatched.update(status=OperationStatus.DISPATCHED, dispatched_at=now)
    publish_changed("operation", ids)


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
    from fleet.inventory.agents import gpus_observed

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
        finished.append(operation.pk)
    Allocation.objects.filter(
        gpu__host=host, generation__lte=generation, state=AllocationState.PENDING
    ).exclude(gpu_id__in=list(failed_gpu_ids)).update(state=AllocationState.ACTIVE)
    publish_changed("operation", finished)
    publish_changed("host", [host.pk])
    transaction.on_commit(lambda: _advance_drains(host.pk))
    publish_changed("gpu", list(Gpu.objects.filter(host=host).values_list("pk", flat=True)))
    return finished


def backoff_seconds(attempts: int) -> float:
    """Re-push delay after ``attempts`` pushes: base, 2x, 4x, ... capped at a minute."""
    base = float(settings.FLEET_PUSH_RETRY_SECONDS)
    delay: float = base * 2.0 ** max(0, attempts - 1)
    return min(MAX_BACKOFF_SECONDS, delay)


def hosts_to_redeliver(now: Any = None, hosts: list[int] | None = None) -> list[int]:
    """Hosts whose agent has not acknowledged the current generation and whose backoff is over."""
    now = now or timezone.now()
    due = []
    behind = Host.objects.filter(applied_generation__lt=F("desired_generation"))
    if hosts is not None:
        behind = behind.filter(pk__in=hosts)
    behind = behind.exclude(status=HostStatus.OFFLINE)
    for host in behind.only(
        "pk", "dispatched_at", "dispatch_attempts", "dispatched_generation", "desired_generation"
    ):
        stale = host.dispatched_generation < host.desired_generation
        never_sent = stale or host.dispatched_at is None
        if never_sent or _waited(now, host.dispatched_at, host.dispatch_attempts):
            due.append(host.pk)
    return due


def _waited(now: Any, since: Any, attempts: int) -> bool:
    return bool((now - since).total_seconds() >= backoff_seconds(attempts))


def operations_expire(now: Any = None) -> list[int]:
    """Expire operations an agent never completed, with a reason a person can act on."""
    now = now or timezone.now()
    deadline = now - timedelta(seconds=float(settings.FLEET_OPERATION_TIMEOUT_SECONDS))
    stuck = (
        Operation.objects.filter(
            status__in=[OperationStatus.PENDING, OperationStatus.DISPATCHED],
            created_at__lt=deadline,
        )
        .exclude(kind="drain")  # a drain has its own deadline and rollback
        .select_related("host")
    )
    expired = []
    for operation in stuck:
        host = operation.host
        where = "the host"
        if host is not None:
            seen = f"{host.last_seen_at:%Y-%m-%d %H:%M:%S}" if host.last_seen_at else "never"
            where = f"host {host.name} ({host.status}, last seen {seen})"
        reason = (
            f"Not acknowledged within {int(settings.FLEET_OPERATION_TIMEOUT_SECONDS)} s: "
            f"{where} has not applied generation {operation.generation}."
        )
        changed = Operation.objects.filter(pk=operation.pk, status=operation.status).update(
            status=OperationStatus.EXPIRED, reason=reason, finished_at=now
        )
        if changed:
            expired.append(operation.pk)
    publish_changed("operation", expired)
    return expired


def hosts_mark_offline(now: Any = None) -> list[int]:
    """Hosts whose agent missed the configured number of heartbeats go offline."""
    now = now or timezone.now()
    limit = float(settings.FLEET_HEARTBEAT_SECONDS) * int(settings.FLEET_OFFLINE_AFTER_MISSED)
    # Only ready hosts go offline: a cordoned or draining host keeps the operator's state.
    stale = Host.objects.filter(status=HostStatus.READY).filter(
        Q(last_seen_at__lt=now - timedelta(seconds=limit))
        | Q(last_seen_at__isnull=True, token_hash__gt="")
    )
    ids = list(stale.values_list("pk", flat=True))
    stale.update(status=HostStatus.OFFLINE)
    publish_changed("host", ids)
    return ids


def _advance_drains(host_id: int) -> None:
    from fleet.allocations.drain import drains_advance  # drains wait for acks like this one

    drains_advance(host_id)
