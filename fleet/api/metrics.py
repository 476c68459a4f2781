"""``/metrics``: Prometheus exposition of fleet, GPU and partition utilisation and allocation,
per-deployment running replicas and restarts, each endpoint's traffic as the gateways measure
it, and operation counts per type and status.

Labels stay few: a deployment is labelled by its name only, never by a replica index or a PID.

Per-GPU device series follow dcgm-exporter's meaning under Fleet names, labelled
``uuid``/``host``/``index`` only; a value the agent reported as ``null`` (NVML has none) is left
out, never exported as 0:

==========================================  ===================================  ===========
Fleet                                       dcgm-exporter                        from
==========================================  ===================================  ===========
``fleet_gpu_temperature_celsius``           ``DCGM_FI_DEV_GPU_TEMP``             telemetry
``fleet_gpu_power_usage_watts``             ``DCGM_FI_DEV_POWER_USAGE``          telemetry
``fleet_gpu_ecc_corrected_errors_total``    ``DCGM_FI_DEV_ECC_SBE_VOL_TOTAL``    telemetry
``fleet_gpu_ecc_uncorrected_errors_total``  ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``    telemetry
``fleet_gpu_xid_errors``                    ``DCGM_FI_DEV_XID_ERRORS``           events
``fleet_gpu_xid_events_total``              (none)                               events
==========================================  ===================================  ===========

The ECC counters are NVML's volatile totals (since the last driver load: a reset reads as a
counter reset). ``fleet_gpu_xid_errors`` is the last Xid a GPU reported, as DCGM's field is;
``fleet_gpu_xid_events_total`` counts the Xid events kept (``FLEET_HEALTH_EVENTS_KEEP_DAYS``).

Values are read from the database (and the telemetry store) at scrape time, so every ASGI
process exposes the same fleet-wide numbers. Scrape with a viewer's API token
(``authorization: {type: Token, credentials: fla_…}`` in the Prometheus job).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db.models import Count, OuterRef, Q, Subquery, Sum
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from rest_framework.decorators import api_view, renderer_classes
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request

from fleet.allocations.models import Allocation, AllocationState, Deployment, WorkloadState
from fleet.allocations.planning.capacity import fleet_capacity
from fleet.api.limits import throttle_scope
from fleet.core.models import Operation
from fleet.endpoints.traffic import traffic_of
from fleet.inventory import refusals
from fleet.inventory.models import Gpu, HealthEvent, HealthEventKind, Host
from fleet.inventory.selectors import latest_telemetry_of
from fleet.partitioning.models import Partition, PartitionKind


class FleetCollector(Collector):
    def collect(self) -> Iterator[Any]:
        yield from self._hosts()
        gpus = list(Gpu.objects.select_related("host"))
        latest = latest_telemetry_of(gpus)
        yield from self._gpus(gpus, latest)
        yield from self._devices(gpus, latest)
        yield from self._partitions()
        yield from self._deployments()
        yield from self._endpoints()
        yield from self._operations()
        yield from self._refusals()
        yield from self._capacity()

    def _hosts(self) -> Iterator[Any]:
        family = GaugeMetricFamily("fleet_hosts", "Hosts by status.", labels=["status"])
        for row in Host.objects.values("status").annotate(n=Count("id")):
            family.add_metric([row["status"]], row["n"])
        yield family
        each = GaugeMetricFamily(
            "fleet_host_status", "One per host: its status.", labels=["host", "status"]
        )
        for name, status in Host.objects.values_list("name", "status"):
            each.add_metric([name, status], 1)
        yield each

    def _devices(
        self, gpus: list[Gpu], latest: dict[int, tuple[dict[str, Any], Any]]
    ) -> Iterator[Any]:
        labels = ["uuid", "host", "index"]
        temp = GaugeMetricFamily(
            "fleet_gpu_temperature_celsius",
            "GPU temperature (DCGM_FI_DEV_GPU_TEMP).",
            labels=labels,
        )
        power = GaugeMetricFamily(
            "fleet_gpu_power_usage_watts",
            "GPU power draw (DCGM_FI_DEV_POWER_USAGE).",
            labels=labels,
        )
        sbe = CounterMetricFamily(
            "fleet_gpu_ecc_corrected_errors",
            "Corrected ECC errors since the driver loaded (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL).",
            labels=labels,
        )
        dbe = CounterMetricFamily(
            "fleet_gpu_ecc_uncorrected_errors",
            "Uncorrected ECC errors since the driver loaded (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL).",
            labels=labels,
        )
        for gpu in gpus:
            values = [gpu.uuid, gpu.host.name, str(gpu.index)]
            sample = latest.get(gpu.pk, ({}, None))[0]
            if sample.get("temperature_c") is not None:
                temp.add_metric(values, sample["temperature_c"])
            if sample.get("power_mw") is not None:
                power.add_metric(values, sample["power_mw"] / 1000)
            if sample.get("ecc_corrected") is not None:
                sbe.add_metric(values, sample["ecc_corrected"])
            if sample.get("ecc_uncorrected") is not None:
                dbe.add_metric(values, sample["ecc_uncorrected"])
        yield from (temp, power, sbe, dbe)
        yield from self._xids(gpus)

    def _xids(self, gpus: list[Gpu]) -> Iterator[Any]:
        labels = ["uuid", "host", "index"]
        last = GaugeMetricFamily(
            "fleet_gpu_xid_errors",
            "The last Xid the GPU reported (DCGM_FI_DEV_XID_ERRORS); absent if none is kept.",
            labels=labels,
        )
        count = CounterMetricFamily(
            "fleet_gpu_xid_events",
            "Xid events kept for the GPU (FLEET_HEALTH_EVENTS_KEEP_DAYS; pruning reads as a "
            "counter reset).",
            labels=labels,
        )
        xids = HealthEvent.objects.filter(kind=HealthEventKind.XID, gpu__isnull=False)
        counts = dict(xids.order_by().values_list("gpu_id").annotate(n=Count("id")))
        newest = xids.filter(gpu_id=OuterRef("gpu_id")).order_by("-ts", "-id").values("pk")[:1]
        latest_xid = dict(xids.filter(pk=Subquery(newest)).values_list("gpu_id", "xid"))
        for gpu in gpus:
            if gpu.pk not in counts:
                continue
            values = [gpu.uuid, gpu.host.name, str(gpu.index)]
            count.add_metric(values, counts[gpu.pk])
            last_value = latest_xid.get(gpu.pk)
            if last_value is not None:
                last.add_metric(values, last_value)
        yield from (last, count)

    def _gpus(
        self, gpus: list[Gpu], latest: dict[int, tuple[dict[str, Any], Any]]
    ) -> Iterator[Any]:
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

    def _deployments(self) -> Iterator[Any]:
        running = GaugeMetricFamily(
            "fleet_deployment_running_replicas",
            "Replicas whose workload the agent reports running (a replica moving counts once).",
            labels=["deployment"],
        )
        restarts = CounterMetricFamily(
            "fleet_deployment_restarts",
            "Workload restarts summed over the deployment's current replicas (a released "
            "replica's restarts leave the sum: Prometheus reads the drop as a reset).",
            labels=["deployment"],
        )
        rows = Deployment.objects.annotate(
            running=Count(
                "allocations__replica",
                filter=Q(allocations__workload_state=WorkloadState.RUNNING),
                distinct=True,
            ),
            # A replica of several GPUs counts once: its other GPUs' allocations mirror the first.
            restarts=Sum("allocations__restarts", filter=Q(allocations__gpu_slot=0), default=0),
        ).values_list("name", "running", "restarts")
        for name, n_running, n_restarts in rows:
            running.add_metric([name], n_running)
            restarts.add_metric([name], n_restarts)
        yield from (running, restarts)

    def _endpoints(self) -> Iterator[Any]:
        """The gateways' last 5 s of each endpoint (several gateways added up); a value no
        gateway measured lately is left out, never exported as 0."""
        names = dict(Deployment.objects.filter(endpoint__isnull=False).values_list("pk", "name"))
        families = {
            "requests_per_s": GaugeMetricFamily(
                "fleet_endpoint_requests_per_second",
                "Requests per second through the gateways, over their last 5 s.",
                labels=["deployment"],
            ),
            "errors_per_s": GaugeMetricFamily(
                "fleet_endpoint_errors_per_second",
                "5xx answers per second through the gateways, over their last 5 s.",
                labels=["deployment"],
            ),
            "in_flight": GaugeMetricFamily(
                "fleet_endpoint_in_flight", "Requests in progress.", labels=["deployment"]
            ),
            "queued": GaugeMetricFamily(
                "fleet_endpoint_queued", "Requests waiting for a replica.", labels=["deployment"]
            ),
            "response_ms": GaugeMetricFamily(
                "fleet_endpoint_response_milliseconds",
                "The replicas' average response time, weighted by their request rates.",
                labels=["deployment"],
            ),
        }
        for pk, traffic in traffic_of(names).items():
            for key, family in families.items():
                value = getattr(traffic, key)
                if value is not None:
                    family.add_metric([names[pk]], value)
        yield from families.values()

    def _operations(self) -> Iterator[Any]:
        family = CounterMetricFamily(
            "fleet_operations",
            "Operations recorded, per type and status.",
            labels=["kind", "status"],
        )
        for row in Operation.objects.values("kind", "status").annotate(n=Count("id")):
            family.add_metric([row["kind"], row["status"]], row["n"])
        yield family

    def _refusals(self) -> Iterator[Any]:
        family = CounterMetricFamily(
            "fleet_agent_messages_refused",
            "Agent messages refused at the boundary (they changed nothing), per host and reason.",
            labels=["host", "reason"],
        )
        names = dict(Host.objects.values_list("pk", "name"))
        for (host_id, reason), n in sorted(refusals.totals().items()):
            family.add_metric([names.get(host_id, str(host_id)), reason], n)
        yield family

    def _capacity(self) -> Iterator[Any]:
        family = GaugeMetricFamily(
            "fleet_capacity_fits_now",
            "Instances of each MIG profile that fit now on the schedulable GPUs of a product "
            "(idle ones plus new ones beside every instance; GET /api/v1/capacity/).",
            labels=["product", "profile"],
        )
        capacity = fleet_capacity()
        for product in capacity["products"]:
            for profile in product["mig"]["profiles"]:
                family.add_metric([product["product"], profile["profile"]], profile["fits_now"])
        yield family
        fragmentation = capacity["fragmentation"]
        stranded = GaugeMetricFamily(
            "fleet_capacity_stranded_gpu_equivalents",
            "Free capacity the expected request mix cannot use, in whole-GPU equivalents "
            "(GET /api/v1/capacity/ fragmentation).",
        )
        stranded.add_metric([], fragmentation["stranded_gpu_equivalents"])
        free = GaugeMetricFamily(
            "fleet_capacity_free_gpu_equivalents",
            "Free capacity on schedulable GPUs, in whole-GPU equivalents.",
        )
        free.add_metric([], fragmentation["free_gpu_equivalents"])
        yield from (stranded, free)


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
@throttle_scope("expensive")  # every scrape reads every GPU, partition and operation
def metrics(request: Request) -> HttpResponse:
    """Prometheus metrics of the whole fleet (any role)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
