"""Reads for the dashboard. Each returns rows with everything its template needs prefetched, so a
page costs a fixed number of queries however large the fleet."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Prefetch, Q, QuerySet
from django.db.models.fields.json import KT

from fleet.allocations.models import Allocation, Deployment
from fleet.core.filters import OperationFilter
from fleet.core.models import FINAL_STATUSES, Operation
from fleet.core.redaction import urls_redacted
from fleet.inventory import selectors as inventory_selectors
from fleet.inventory.models import Gpu, HealthEvent, HealthEventKind, Host
from fleet.partitioning.models import Partition, PartitionKind

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


LIGHT_GPU_FIELDS = ("id", "host_id", "index", "product_name", "mode", "health", "cordoned")


def fleet_gpu_rows(*, host_ids: Iterable[int] | None = None) -> QuerySet[Gpu]:
    """Every GPU (of these hosts), by host and index, with only what the fleet's and the hosts'
    summaries and the product list read: no JSON column is decoded (10,000 rows of them cost
    seconds); the checkpoint's utilisation comes out of ``last_telemetry`` in SQL, as
    ``checkpoint_util`` (the live-event key) and ``checkpoint_util_gpu`` (the agent's)."""
    queryset = (
        Gpu.objects.only(*LIGHT_GPU_FIELDS)
        .annotate(
            checkpoint_util=KT("last_telemetry__utilization_percent"),
            checkpoint_util_gpu=KT("last_telemetry__utilization_gpu_percent"),
        )
        .order_by("host__name", "index")
    )
    if host_ids is not None:
        queryset = queryset.filter(host_id__in=list(host_ids))
    return queryset


def gpu_utilization(rows: Iterable[Gpu]) -> dict[int, Any]:
    """``{gpu id: utilisation}`` of :func:`fleet_gpu_rows` rows: the hot telemetry store's latest
    sample, else the row's checkpoint (raw values: the presenters read them)."""
    rows = list(rows)
    hot = inventory_selectors.latest_telemetry(g.pk for g in rows)
    found: dict[int, Any] = {}
    for gpu in rows:
        latest = hot.get(gpu.pk)
        if latest is not None:
            sample = latest["sample"]
            found[gpu.pk] = sample.get("utilization_percent", sample.get("utilization_gpu_percent"))
        else:
            checkpoint = getattr(gpu, "checkpoint_util", None)
            found[gpu.pk] = (
                checkpoint if checkpoint is not None else getattr(gpu, "checkpoint_util_gpu", None)
            )
    return found


def allocation_counts(*, host_ids: Iterable[int] | None = None) -> dict[int, int]:
    """``{gpu id: allocations}`` of the GPUs (of these hosts) holding any: one query."""
    queryset = Allocation.objects.all()
    if host_ids is not None:
        queryset = queryset.filter(gpu__host_id__in=list(host_ids))
    rows = queryset.values("gpu_id").annotate(n=Count("pk")).values_list("gpu_id", "n")
    return {gpu_id: n for gpu_id, n in rows if gpu_id is not None}


def free_instance_counts(*, host_ids: Iterable[int] | None = None) -> dict[int, int]:
    """``{host id: MIG instances holding no allocation}``: one query."""
    queryset = Partition.objects.filter(kind=PartitionKind.MIG, allocations__isnull=True)
    if host_ids is not None:
        queryset = queryset.filter(gpu__host_id__in=list(host_ids))
    rows = queryset.values("gpu__host_id").annotate(n=Count("pk")).values_list("gpu__host_id", "n")
    return dict(rows)


def fleet_hosts(*, host_ids: Iterable[int] | None = None) -> QuerySet[Host]:
    queryset = Host.objects.all()
    if host_ids is not None:
        queryset = queryset.filter(pk__in=list(host_ids))
    return queryset.order_by("name")


def hosts_with_gpus(*, host_id: int | None = None) -> QuerySet[Host]:
    """Hosts by name with their GPUs (one more query), for the host pages."""
    queryset = Host.objects.prefetch_related(
        Prefetch("gpus", queryset=Gpu.objects.order_by("index"))
    ).order_by("name")
    if host_id is not None:
        queryset = queryset.filter(pk=host_id)
    return queryset


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


def host_ids_of(gpu_ids: Iterable[int]) -> set[int]:
    """The hosts of these GPUs."""
    ids = list(gpu_ids)
    if not ids:
        return set()
    return set(Gpu.objects.filter(pk__in=ids).values_list("host_id", flat=True))


def gpu_detail(gpu_id: int) -> Gpu | None:
    return fleet_gpus(gpu_ids=[gpu_id]).first()


def tray_deployments(*, deployment_ids: Iterable[int] | None = None) -> QuerySet[Deployment]:
    """Deployments with their allocations, their GPUs and partitions (the tray and its cards)."""
    allocations = Allocation.objects.select_related("gpu__host", "partition").order_by(
        "replica", "gpu_slot"
    )
    queryset = Deployment.objects.select_related("team", "autoscaling").prefetch_related(
        Prefetch("allocations", queryset=allocations)
    )
    if deployment_ids is not None:
        queryset = queryset.filter(pk__in=list(deployment_ids))
    return queryset.order_by("name")


def deployment_detail(deployment_id: int) -> Deployment | None:
    """One deployment with its allocations (GPUs, hosts, partitions) and its creator."""
    return (
        tray_deployments(deployment_ids=[deployment_id])
        .select_related("created_by", "endpoint")
        .first()
    )


def deployment_events(deployment: Deployment, *, limit: int = 30) -> list[HealthEvent]:
    """Health events of the GPUs its replicas hold, and the crash loops agents reported for its
    replicas (their ``detail`` starts with the deployment's name: see
    ``hostagent.runtime.operations``)."""
    gpu_ids = {a.gpu_id for a in deployment.allocations.all()}
    crashloops = Q(kind=HealthEventKind.CRASHLOOP, detail__startswith=f"{deployment.name} replica ")
    return list(
        HealthEvent.objects.filter(Q(gpu_id__in=gpu_ids) | crashloops)
        .select_related("host", "gpu")
        .order_by("-ts", "-id")[:limit]
    )


def operations_feed(
    *,
    ids: Iterable[int] | None = None,
    status: str = "",
    kind: str = "",
    gpu_id: int | None = None,
    deployment_id: int | None = None,
    host_id: int | None = None,
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
    if deployment_id is not None:
        queryset = queryset.filter(deployment_id=deployment_id)
    if host_id is not None:
        queryset = queryset.filter(host_id=host_id)
    return _shown(queryset.order_by("-created_at", "-id")[:limit])


def _shown(operations: Iterable[Operation]) -> list[Operation]:
    """The rows as the pages show them: URLs in summaries and reasons without credentials or
    query strings (a webhook's URL). Changed in memory only; never saved."""
    rows = list(operations)
    for op in rows:
        op.summary, op.reason = urls_redacted(op.summary), urls_redacted(op.reason)
    return rows


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


def target_rows(
    *, gpu_ids: Iterable[int], partition_ids: Iterable[int]
) -> tuple[dict[int, Gpu], dict[int, Partition]]:
    """The GPUs (with their hosts) and partitions that placement targets name, to say them in
    words: two queries however many targets."""
    gpus = Gpu.objects.select_related("host").filter(pk__in=list(gpu_ids))
    partitions = Partition.objects.filter(pk__in=list(partition_ids))
    return {g.pk: g for g in gpus}, {p.pk: p for p in partitions}


@dataclass(frozen=True)
class OperationsPage:
    rows: list[Operation]
    older: int | None  # the ``before`` cursor of the next page; None on the last
    errors: dict[str, list[str]]


def operations_page(params: Mapping[str, Any], *, size: int) -> OperationsPage:
    """One page of the operations feed, newest first, filtered as the API filters
    (:class:`fleet.core.filters.OperationFilter`); ``before`` (an operation id) starts the page
    just after that operation, so a page is one query however deep it is."""
    filterset = OperationFilter(
        params,
        queryset=Operation.objects.select_related("requested_by", "gpu", "host", "deployment"),
    )
    if not filterset.is_valid():
        return OperationsPage(rows=[], older=None, errors=dict(filterset.errors))
    queryset = filterset.qs.order_by("-created_at", "-id")
    before = str(params.get("before") or "")
    if before.isdecimal() and len(before) < 19:
        pivot = Operation.objects.filter(pk=int(before)).values_list("created_at", flat=True)
        at = pivot.first()
        if at is not None:
            queryset = queryset.filter(Q(created_at__lt=at) | Q(created_at=at, pk__lt=int(before)))
    rows = list(queryset[: size + 1])
    older = rows[size - 1].pk if len(rows) > size else None
    return OperationsPage(rows=_shown(rows[:size]), older=older, errors={})
