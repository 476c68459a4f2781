"""``/metrics``: Prometheus text for fleet, GPU and partition allocation and operations."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.mig import product_by_key
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


def test_metrics_export_what_fits_now_per_product_and_profile(viewer_client):
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(
        gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("3g.40gb", 4),))
    )
    fits = {
        (s.labels["product"], s.labels["profile"]): s.value
        for s in scrape(viewer_client)["fleet_capacity_fits_now"]
    }
    assert fits[("NVIDIA H100 80GB HBM3", "3g.40gb")] == 2  # the idle one at 4, a new one at 0
    assert fits[("NVIDIA H100 80GB HBM3", "7g.80gb")] == 0
    h100 = product_by_key("h100-sxm5-80gb")
    assert h100 is not None
    assert set(fits) == {("NVIDIA H100 80GB HBM3", p.name) for p in h100.profiles}


def test_metrics_count_running_replicas_and_restarts_per_deployment_with_one_label(
    viewer_client,
):
    from fleet.allocations.models import Allocation, WorkloadState

    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(
        gpu_id=gpu.pk,
        spec=LayoutSpec(
            mode="mig",
            instances=(MigInstanceSpec("3g.40gb", 0), MigInstanceSpec("3g.40gb", 4)),
        ),
    )
    chat = deployment_create(
        name="chat", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=2
    )
    for partition in Partition.objects.filter(gpu=gpu):
        deployment_place(deployment_id=chat.pk, partition_id=partition.pk)
    deployment_create(
        name="idle", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    first, second = Allocation.objects.filter(deployment=chat).order_by("replica")
    Allocation.objects.filter(pk=first.pk).update(workload_state=WorkloadState.RUNNING, restarts=3)
    Allocation.objects.filter(pk=second.pk).update(
        workload_state=WorkloadState.CRASHLOOP, restarts=4
    )
    families = scrape(viewer_client)
    running = {
        s.labels["deployment"]: s.value for s in families["fleet_deployment_running_replicas"]
    }
    restarts = {
        s.labels["deployment"]: s.value
        for s in families["fleet_deployment_restarts"]
        if s.name == "fleet_deployment_restarts_total"
    }
    assert running == {"chat": 1, "idle": 0}
    assert restarts == {"chat": 7, "idle": 0}
    for name in ("fleet_deployment_running_replicas", "fleet_deployment_restarts"):
        assert all(set(s.labels) == {"deployment"} for s in families[name])  # no PID, no index
    text = viewer_client.get("/metrics").content.decode()
    assert 'fleet_deployment_running_replicas{deployment="chat"} 1.0' in text
    assert 'fleet_deployment_restarts_total{deployment="chat"} 7.0' in text
