"""``/metrics``: Prometheus text for fleet, GPU and partition allocation and operations."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.factories import GpuFactory
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


def scrape(client) -> dict[str, list]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(response.content.decode())}


def test_metrics_need_a_login(anon_client):
    assert_error(anon_client.get("/metrics"), 401)


def test_metrics_cover_gpus_partitions_allocation_and_operations(viewer_client):
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(
        gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("3g.40gb", 4),))
    )
    d = deployment_create(
        name="chat", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    deployment_place(deployment_id=d.pk, partition_id=Partition.objects.get(gpu=gpu).pk)
    families = scrape(viewer_client)
    (info,) = families["fleet_gpu_info"]
    assert info.labels["health"] == "healthy" and info.labels["mode"] == "mig"
    (reserved,) = families["fleet_gpu_memory_allocated_mib"]
    assert reserved.value == Partition.objects.get(gpu=gpu).memory_mib
    (partition,) = families["fleet_partition_allocations"]
    assert partition.labels["profile"] == "3g.40gb" and partition.value == 1
    ops = {
        (s.labels["kind"], s.labels["status"]): s.value
        for s in families["fleet_operations"]
        if s.name.endswith("_total")
    }
    assert ops[("set_layout", "pending")] + ops.get(("set_layout", "dispatched"), 0) >= 1
    assert ops[("place", "pending")] + ops.get(("place", "dispatched"), 0) == 1
    assert 0 < families["fleet_memory_allocation_ratio"][0].value <= 1
    assert (
        "fleet_gpu_utilization_percent" not in families
        or not families["fleet_gpu_utilization_percent"]
    )
