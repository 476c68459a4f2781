"""``/metrics``: Prometheus exposition of fleet, GPU and partition utilisation and allocation,
and operation counts per type and status.

Values are read from the database (and the telemetry store) at scrape time, so every ASGI
process exposes the same fleet-wide numbers. Scrape with a viewer's API token
(``authorization: {type: Token, credentials: fla_…}`` in the Prometheus job).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db.models import Count, Sum
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from rest_framework.decorators import api_view, renderer_classes
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request

from fleet.allocations.models import Allocation, AllocationState
from fleet.inventory.models import Gpu, Host
from fleet.inventory.selectors import latest_telemetry_of
from fleet.partitioning.models import Operation, Partition, PartitionKind


class FleetCollector(Collector):
    def collect(self) -> Iterator[Any]:
        yield from self._hosts()
        gpus = list(Gpu.objects.select_related("host"))
        yield from self._gpus(gpus)
        yield from self._partitions()
        yield from self._operations()

    def _hosts(self) -> Iterator[Any]:
        family = GaugeMetricFamily("fleet_hosts", "Hosts by status.", labels=["status"])
        for row in Host.objects.values("status").annotate(n=Count("id")):
            family.add_metric([row["status"]], row["n"])
        yield family

    def _gpus(self, gpus: list[Gpu]) -> Iterator[Any]:
        labels = ["gpu", "uuid", "host", "product", "mode"]
        state = GaugeMetricFamily(
            "fleet_gpu_info",
            "One per GPU: health and cordon state.",
            labels=[*labels, "health", "cordoned"],
        )
        util = GaugeMetricFamily(
            "fleet_gpu_utilization_percent",
            "Latest GPU utilisation (absent where NVML has none, e.g. MIG mode).",
            labels=labels,
        )
        mem = GaugeMetricFamily(
            "fleet_gpu_memory_used_mib", "Latest GPU memory used.", labels=labels
        )
        total = GaugeMetricFamily("fleet_gpu_memory_total_mib", "GPU memory.", labels=labels)
        reserved = GaugeMetricFamily(
            "fleet_gpu_memory_allocated_mib", "GPU memory reserved by allocations.", labels=labels
        )
        allocated = dict(Allocation.objects.values_list("gpu_id").annotate(mib=Sum("memory_mib")))
        latest = latest_telemetry_of(gpus)
        for gpu in gpus:
            values = [str(gpu.pk), gpu.uuid, gpu.host.name, gpu.product_name, gpu.mode]
            state.add_metric([*values, gpu.health, str(gpu.cordoned).lower()], 1)
            total.add_metric(values, gpu.memory_mib)
            reserved.add_metric(values, allocated.get(gpu.pk, 0))
            sample = latest.get(gpu.pk, ({}, None))[0]
            if sample.get("utilization_gpu_percent") is not None:
                util.add_metric(values, sample["utilization_gpu_percent"])
            if sample.get("memory_used_mib") is not None:
                mem.add_metric(values, sample["memory_used_mib"])
        yield from (state, util, mem, total, reserved)
        fleet_total = sum(g.memory_mib for g in gpus)
        ratio = GaugeMetricFamily(
            "fleet_memory_allocation_ratio",
            "Reserved GPU memory / total GPU memory across the fleet.",
        )
        ratio.add_metric([], (sum(allocated.values()) / fleet_total) if fleet_total else 0.0)
        yield ratio

    def _partitions(self) -> Iterator[Any]:
        family = GaugeMetricFamily(
            "fleet_partition_allocations",
            "Replicas bound to each partition (MIG instance or whole GPU).",
            labels=["gpu", "partition", "kind", "profile", "start"],
        )
        for p in Partition.objects.annotate(n=Count("allocations")):
            family.add_metric(
                [
                    str(p.gpu_id),
                    str(p.pk),
                    p.kind,
                    p.profile_name or "gpu",
                    str(p.start) if p.kind == PartitionKind.MIG else "",
                ],
                p.n,
            )
        yield family
        replicas = GaugeMetricFamily(
            "fleet_allocations", "Allocations by state.", labels=["kind", "state"]
        )
        for row in Allocation.objects.values("kind", "state").annotate(n=Count("id")):
            replicas.add_metric([row["kind"], row["state"] or AllocationState.PENDING], row["n"])
        yield replicas

    def _operations(self) -> Iterator[Any]:
        family = CounterMetricFamily(
            "fleet_operations",
            "Operations recorded, per type and status.",
            labels=["kind", "status"],
        )
        for row in Operation.objects.values("kind", "status").annotate(n=Count("id")):
            family.add_metric([row["kind"], row["status"]], row["n"])
        yield family


class PrometheusRenderer(BaseRenderer):
    media_type = "text/plain"
    format = "prometheus"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        return data if isinstance(data, bytes) else str(data).encode()


@extend_schema(exclude=True)  # Prometheus exposition, not part of the REST API
@api_view(["GET"])
@renderer_classes([JSONRenderer, PrometheusRenderer])
def metrics(request: Request) -> HttpResponse:
    """Prometheus metrics of the whole fleet (any role)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
