"""Reads for the dashboard. Each returns rows with everything its template needs prefetched, so a
page costs a fixed number of queries however large the fleet."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import Prefetch, Q, QuerySet

from fleet.allocations.models import Allocation, Deployment
from fleet.inventory import selectors as inventory_selectors
from fleet.inventory.models import Gpu, HealthEvent, Host
from fleet.partitioning.models import FINAL_STATUSES, Operation, Partition

HISTORY_SECONDS = 3600


def _partitions_prefetch() -> Prefetch[Any]:
    allocations = Allocation.objects.select_related("deployment").order_by(
        "deployment__name", "replica", "gpu_slot"
    )
    return Prefetch(
        "partitions",
        queryset=Partition.objects.order_by("kind", "start").prefetch_related(
            Prefetch("allocations", queryset=allocations)
        ),
    )


def fleet_gpus(*, gpu_ids: Iterable[int] | None = None) -> QuerySet[Gpu]:
    """GPUs with their host, partitions and allocations (with deployments), by host and index."""
    queryset = Gpu.objects.select_related("host").prefetch_related(_partitions_prefetch())
    if gpu_ids is not None:
        queryset = queryset.filter(pk__in=list(gpu_ids))
    return queryset.order_by("host__name", "index")


def fleet_hosts(*, host_ids: Iterable[int] | None = None) -> QuerySet[Host]:
    queryset = Host.objects.all()
    if host_ids is not None:
        queryset = queryset.filter(pk__in=list(host_ids))
    return queryset.order_by("name")


def gpus_applying(gpu_ids: Iterable[int] | None = None) -> set[int]:
    """GPUs with an operation the agent has not finished yet (desired differs from applied)."""
    queryset = Operation.objects.exclude(status__in=FINAL_STATUSES).filter(gpu__isnull=False)
    if gpu_ids is not None:
        queryset = queryset.filter(gpu_id__in=list(gpu_ids))
    return {gpu_id for gpu_id in queryset.values_list("gpu_id", flat=True) if gpu_id is not None}


def gpu_ids_touched(
    *,
    gpu_ids: Iterable[int] = (),
    partition_ids: Iterable[int] = (),
    allocation_ids: Iterable[int] = (),
    host_ids: Iterable[int] = (),
) -> set[int]:
    """The GPUs whose card shows any of these rows (a changed row re-renders its card)."""
    found = set(gpu_ids)
    partition_ids, allocation_ids, host_ids = (
        list(partition_ids),
        list(allocation_ids),
        list(host_ids),
    )
    if partition_ids:
        found |= set(
            Partition.objects.filter(pk__in=partition_ids).values_list("gpu_id", flat=True)
        )
    if allocation_ids:
        found |= set(
            Allocation.objects.filter(pk__in=allocation_ids).values_list("gpu_id", flat=True)
        )
    if host_ids:
        found |= set(Gpu.objects.filter(host_id__in=host_ids).values_list("pk", flat=True))
    return found


def gpu_detail(gpu_id: int) -> Gpu | None:
    return fleet_gpus(gpu_ids=[gpu_id]).first()


def tray_deployments(*, deployment_ids: Iterable[int] | None = None) -> QuerySet[Deployment]:
    """Deployments with their allocations, their GPUs and partitions (the tray and its cards)."""
    allocations = Allocation.objects.select_related("gpu__host", "partition").order_by(
        "replica", "gpu_slot"
    )
    queryset = Deployment.objects.prefetch_related(Prefetch("allocations", queryset=allocations))
    if deployment_ids is not None:
        queryset = queryset.filter(pk__in=list(deployment_ids))
    return queryset.order_by("name")


def operations_feed(
    *,
    ids: Iterable[int] | None = None,
    status: str = "",
    kind: str = "",
    gpu_id: int | None = None,
    limit: int = 100,
) -> list[Operation]:
    queryset = Operation.objects.select_related("requested_by", "gpu", "host", "deployment")
    if ids is not None:
        queryset = queryset.filter(pk__in=list(ids))
    if status:
        queryset = queryset.filter(status=status)
    if kind:
        queryset = queryset.filter(kind=kind)
    if gpu_id is not None:
        queryset = queryset.filter(Q(gpu_id=gpu_id))
    return list(queryset.order_by("-created_at", "-id")[:limit])


def gpu_events(gpu: Gpu, *, limit: int = 30) -> list[HealthEvent]:
    """Health events of the GPU and of its host (a host going offline concerns every GPU)."""
    return list(
        HealthEvent.objects.filter(Q(gpu=gpu) | Q(host_id=gpu.host_id, gpu__isnull=True)).order_by(
            "-ts", "-id"
        )[:limit]
    )


def latest_samples(gpus: Iterable[Gpu]) -> dict[int, tuple[dict[str, Any], datetime | None]]:
    """The latest agent sample of each GPU (the hot telemetry store, else the row's checkpoint),
    in one round trip for any number of GPUs."""
    return inventory_selectors.latest_telemetry_of(gpus)


def gpu_history(
    gpu: Gpu, *, seconds: int = HISTORY_SECONDS, now: float | None = None
) -> list[dict[str, float | None]]:
    """Telemetry points of the last ``seconds`` (1 s points; per-minute means further back).
    ``None`` stays ``None`` (NVML had no value)."""
    return [
        {
            "t": point["ts"],
            "utilization_percent": point["utilization_percent"],
            "memory_used_mib": point["memory_used_mib"],
            "temperature_c": point["temperature_c"],
            "power_w": point["power_w"],
        }
        for point in inventory_selectors.gpu_history(gpu.pk, seconds=seconds, now=now)
    ]
