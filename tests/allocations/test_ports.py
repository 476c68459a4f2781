"""Where a replica serves: the host ports its agent reports are checked before they are stored
(a hostile report changes nothing), and the API shows each replica's ``ports``, ``address``
and ``ready``."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.workloads import workloads_record
from fleet.inventory.models import Host, HostStatus
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from hostagent import protocol
from tests.allocations.test_workloads import CONTAINER, _placed, _status
from tests.allocations.test_workloads import mig_gpu as mig_gpu  # the fixture
from tests.factories import GpuFactory, HostFactory
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

SERVER = {
    **CONTAINER,
    "ports": [{"name": "http", "port": 8000}, {"name": "metrics", "port": 9100}],
}


def _report(allocation: Allocation, ports: Any, state: str = "running") -> None:
    status = {**_status(allocation.pk, state), "ports": ports}
    protocol.validate_message(
        {"type": "workloads", "ts": 1.0, "full": False, "workloads": [status]}
    )
    workloads_record(host_id=allocation.gpu.host_id, statuses=[status], full=False)


def test_a_replicas_ports_address_and_readiness_are_listed_per_deployment(mig_gpu, viewer_client):
    Host.objects.filter(pk=mig_gpu.host_id).update(address="10.0.0.7")
    allocation = _placed(mig_gpu, workload=SERVER)
    listed = viewer_client.get(f"/api/v1/allocations/?deployment={allocation.deployment_id}")
    [before] = listed.json()["results"]
    assert (before["ports"], before["address"], before["ready"]) == ({}, None, False)

    _report(allocation, {"http": 20001, "metrics": 20002}, state="starting")
    body = viewer_client.get(f"/api/v1/allocations/{allocation.pk}/").json()
    assert body["ports"] == {"http": 20001, "metrics": 20002}
    assert (body["address"], body["ready"]) == ("10.0.0.7:20001", False)

    _report(allocation, {"http": 20001, "metrics": 20002})
    assert viewer_client.get(f"/api/v1/allocations/{allocation.pk}/").json()["ready"] is True
    Host.objects.filter(pk=mig_gpu.host_id).update(status=HostStatus.OFFLINE)
    assert viewer_client.get(f"/api/v1/allocations/{allocation.pk}/").json()["ready"] is False


def test_a_host_that_gave_no_address_shows_none(mig_gpu, viewer_client):
    allocation = _placed(mig_gpu, workload=SERVER)
    _report(allocation, {"http": 20001, "metrics": 20002})
    body = viewer_client.get(f"/api/v1/allocations/{allocation.pk}/").json()
    assert body["ports"] == {"http": 20001, "metrics": 20002} and body["address"] is None


def test_an_ipv6_address_is_bracketed(mig_gpu, viewer_client):
    Host.objects.filter(pk=mig_gpu.host_id).update(address="fd00::7")
    allocation = _placed(mig_gpu, workload=SERVER)
    _report(allocation, {"http": 20001, "metrics": 20002})
    body = viewer_client.get(f"/api/v1/allocations/{allocation.pk}/").json()
    assert body["address"] == "[fd00::7]:20001"


def _mig_gpu_on(host) -> Any:
    gpu = GpuFactory(host=host, product_key="h100-sxm5-80gb")
    gpu_set_layout(
        gpu_id=gpu.pk,
        spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec(profile="3g.40gb", start=4),)),
    )
    return gpu


@pytest.fixture
def two_replicas(mig_gpu):
    first = _placed(mig_gpu, "one", workload=SERVER)
    second = _placed(_mig_gpu_on(mig_gpu.host), "two", workload=SERVER)
    return first, second


def test_a_port_another_replica_of_the_host_holds_is_refused_and_changes_nothing(two_replicas):
    first, second = two_replicas
    _report(first, {"http": 20001, "metrics": 20002})
    _report(second, {"http": 20003, "metrics": 20004})
    _report(second, {"http": 20001, "metrics": 20005}, state="starting")
    second.refresh_from_db()
    assert second.ports == {"http": 20003, "metrics": 20004}
    assert second.workload_state == "starting"  # the rest of the report is taken
    first.refresh_from_db()
    assert first.ports == {"http": 20001, "metrics": 20002}


def test_a_port_name_the_workload_does_not_declare_is_refused(mig_gpu):
    allocation = _placed(mig_gpu, workload=SERVER)
    _report(allocation, {"ssh": 22})
    allocation.refresh_from_db()
    assert allocation.ports == {} and allocation.workload_state == "running"


def test_a_replica_on_another_host_may_hold_the_same_port(mig_gpu):
    other = _mig_gpu_on(HostFactory(runtime="docker"))
    here = _placed(mig_gpu, "here", workload=SERVER)
    there = _placed(other, "there", workload=SERVER)
    _report(here, {"http": 20001})
    _report(there, {"http": 20001})
    there.refresh_from_db()
    assert there.ports == {"http": 20001}


def test_the_workload_declares_ports_through_the_api(operator_client):
    body = {
        "name": "svc",
        "kind": "mig",
        "profile": "1g.10gb",
        "replicas": 1,
        "workload": {**SERVER},
    }
    created = operator_client.post("/api/v1/deployments/", body, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["workload"]["ports"] == SERVER["ports"]
    twice = {**body, "name": "svc2", "workload": {**SERVER, "ports": SERVER["ports"] * 2}}
    hostile = {**body, "name": "svc3", "workload": {**SERVER, "ports": [{"name": "A", "port": 0}]}}
    for bad in (twice, hostile):
        error = assert_error(operator_client.post("/api/v1/deployments/", bad, format="json"), 400)
        assert error["code"] in ("invalid", "workload.invalid"), error
    assert not Deployment.objects.filter(name__in=["svc2", "svc3"]).exists()
