"""Health that acts and recovers: faults mark a GPU unhealthy and cordon it, its replicas move
to healthy capacity, and it returns to service when the fault clears."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.agents.reports import agent_event
from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.models import Operation
from fleet.inventory.models import Gpu, HealthEvent
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_cordon, gpu_set_layout
from fleet.workflows.health import gpus_recover_quiet, replicas_retry
from tests.factories import GpuFactory, HostFactory
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_mps_gpus():
    host = HostFactory()
    gpus = [GpuFactory(host=host, product_key="a30-24gb") for _ in range(2)]
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    deployment = deployment_create(
        name="asr", request=DeploymentRequest(kind="mps", memory_mib=4096), replicas=1
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=gpus[0].pk)
    return gpus


def event(gpu, kind, *, xid=None, detail=""):
    return agent_event(
        host=gpu.host,
        event={
            "type": "event",
            "kind": kind,
            "gpu_uuid": gpu.uuid,
            "gpu_instance_id": None,
            "xid": xid,
            "detail": detail,
            "ts": timezone.now().timestamp(),
        },
    )


def gpu_of_replica():
    return Allocation.objects.get().gpu_id


@pytest.mark.parametrize(
    ("kind", "kwargs", "health", "cause"),
    [
        ("xid", {"xid": 79, "detail": "fell off the bus"}, "unhealthy", "xid"),
        ("ecc", {"detail": "ECC errors: 2 uncorrected, 0 corrected"}, "unhealthy", "ecc"),
        ("ecc", {"detail": "ECC event 0x2"}, "unhealthy", "ecc"),
        ("mps_down", {"detail": "MPS daemon does not answer"}, "unhealthy", "mps"),
        ("gpu_lost", {"detail": "GPU is lost"}, "lost", "lost"),
    ],
)
def test_a_fault_cordons_the_gpu_and_moves_its_replicas(
    two_mps_gpus, django_capture_on_commit_callbacks, kind, kwargs, health, cause
):
    sick, healthy = two_mps_gpus
    with django_capture_on_commit_callbacks(execute=True):
        event(sick, kind, **kwargs)
    sick.refresh_from_db()
    assert (sick.health, sick.health_cause, sick.cordoned, sick.auto_cordoned) == (
        health,
        cause,
        True,
        True,
    )
    assert gpu_of_replica() == healthy.pk
    kinds = list(Operation.objects.order_by("id").values_list("kind", flat=True))
    if cause == "ecc":  # the GPU still works: make before break (this replica runs nothing)
        assert kinds[-2:] == ["health", "move"]
        assert Operation.objects.get(kind="move").status == "succeeded"
    else:  # a dead GPU: stop, then start elsewhere
        assert kinds[-4:] == ["health", "evict", "place", "replace"]
        assert Operation.objects.get(kind="replace").status == "succeeded"


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_leave_the_gpu_healthy(
    two_mps_gpus, django_capture_on_commit_callbacks, xid
):
    sick, _ = two_mps_gpus
    with django_capture_on_commit_callbacks(execute=True):
        event(sick, "xid", xid=xid)
    sick.refresh_from_db()
    assert sick.health == "healthy" and not sick.cordoned
    assert gpu_of_replica() == sick.pk
    assert HealthEvent.objects.filter(xid=xid).exists()


def test_corrected_ecc_errors_leave_the_gpu_healthy(two_mps_gpus):
    sick, _ = two_mps_gpus
    event(sick, "ecc", detail="ECC errors: 0 uncorrected, 5 corrected")
    event(sick, "ecc", detail="ECC event 0x1")
    assert Gpu.objects.get(pk=sick.pk).health == "healthy"


def test_the_mps_daemon_coming_back_returns_the_gpu_to_service(
    two_mps_gpus, django_capture_on_commit_callbacks
):
    sick, _ = two_mps_gpus
    with django_capture_on_commit_callbacks(execute=True):
        event(sick, "mps_down")
    event(sick, "mps_up", detail="MPS daemon answers again")
    sick.refresh_from_db()
    assert (sick.health, sick.cordoned, sick.health_cause) == ("healthy", False, "")
    assert Operation.objects.filter(kind="health", summary__contains="back in service").exists()


def test_an_operators_cordon_survives_recovery(two_mps_gpus, django_capture_on_commit_callbacks):
    sick, _ = two_mps_gpus
    gpu_set_cordon(gpu_id=sick.pk, cordoned=True, reason="maintenance")
    with django_capture_on_commit_callbacks(execute=True):
        event(sick, "gpu_lost")
    event(sick, "gpu_back")
    sick.refresh_from_db()
    assert (sick.health, sick.cordoned, sick.cordon_reason) == ("healthy", True, "maintenance")


def test_a_lost_gpu_stays_lost_through_other_faults(
    two_mps_gpus, django_capture_on_commit_callbacks
):
    sick, _ = two_mps_gpus
    with django_capture_on_commit_callbacks(execute=True):
        event(sick, "gpu_lost")
        event(sick, "xid", xid=79)
    assert Gpu.objects.get(pk=sick.pk).health == "lost"


def test_without_healthy_capacity_the_replica_waits_with_a_reason(
    two_mps_gpus, django_capture_on_commit_callbacks
):
    sick, other = two_mps_gpus
    gpu_set_cordon(gpu_id=other.pk, cordoned=True)
    with django_capture_on_commit_callbacks(execute=True):
        event(sick, "xid", xid=48)
    assert not Allocation.objects.exists()
    failed = Operation.objects.get(kind="replace")
    assert failed.status == "failed" and "No healthy capacity" in failed.reason


def test_a_replica_left_without_capacity_is_placed_when_capacity_returns(
    two_mps_gpus, django_capture_on_commit_callbacks
):
    sick, other = two_mps_gpus
    gpu_set_cordon(gpu_id=other.pk, cordoned=True)
    with django_capture_on_commit_callbacks(execute=True):
        event(sick, "xid", xid=48)
    assert replicas_retry() == []  # still nowhere to go
    gpu_set_cordon(gpu_id=other.pk, cordoned=False)
    (done,) = replicas_retry()
    assert gpu_of_replica() == other.pk
    failed = Operation.objects.get(kind="replace", status="failed")
    assert failed.result["replaced_by"] == done
    assert replicas_retry() == []  # nothing left to retry


def test_a_fatal_xid_clears_after_a_quiet_period(
    two_mps_gpus, django_capture_on_commit_callbacks, settings
):
    settings.FLEET_XID_RECOVERY_SECONDS = 60
    sick, _ = two_mps_gpus
    with django_capture_on_commit_callbacks(execute=True):
        event(sick, "xid", xid=79)
    assert gpus_recover_quiet() == []
    assert gpus_recover_quiet(now=timezone.now() + timedelta(seconds=61)) == [sick.pk]
    sick.refresh_from_db()
    assert sick.health == "healthy" and not sick.cordoned


def test_operators_heal_a_gpu_through_the_api(
    two_mps_gpus, operator_client, viewer_client, django_capture_on_commit_callbacks
):
    sick, _ = two_mps_gpus
    assert_error(
        operator_client.post(f"/api/v1/gpus/{sick.pk}/heal", {}, format="json"),
        409,
        "gpu.already_healthy",
    )
    with django_capture_on_commit_callbacks(execute=True):
        event(sick, "ecc", detail="ECC event 0x2")
    assert_error(viewer_client.post(f"/api/v1/gpus/{sick.pk}/heal", {}, format="json"), 403)
    response = operator_client.post(f"/api/v1/gpus/{sick.pk}/heal", {}, format="json")
    assert response.status_code == 200 and response.json()["kind"] == "health"
    body = operator_client.get(f"/api/v1/gpus/{sick.pk}/").json()
    assert (body["health"], body["cordoned"]) == ("healthy", False)
    assert_error(operator_client.post("/api/v1/gpus/999999/heal", {}, format="json"), 404)
