"""A deployment's endpoint through the API (set on create or PATCH, checked, audited, removed)
and the routes the gateways take from the copies' states."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from fleet.allocations.models import Allocation, AllocationState, Deployment
from fleet.core.models import Operation
from fleet.endpoints.models import Endpoint
from fleet.endpoints.selectors import gateway_routes
from fleet.endpoints.services import endpoint_set
from fleet.inventory.models import Host, HostStatus
from tests.allocations.test_ports import SERVER, _report
from tests.allocations.test_workloads import _placed
from tests.allocations.test_workloads import mig_gpu as mig_gpu  # the fixture
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

BODY = {"name": "qwen", "kind": "mps", "memory_mib": 4096, "workload": SERVER}


def _create(client: Any, **extra: Any) -> Any:
    return client.post("/api/v1/deployments/", {**BODY, **extra}, format="json")


@override_settings(FLEET_GATEWAY_URL="http://gw.example:8080")
def test_an_endpoint_is_set_on_create_shown_with_its_url_changed_and_removed(operator_client):
    answer = _create(operator_client, endpoint={"path_prefix": "/qwen"})
    assert answer.status_code == 201, answer.json()
    created = answer.json()
    assert created["endpoint"] == {
        "port": "http",  # the workload's first declared port
        "path_prefix": "/qwen",
        "hostname": None,
        "drain_s": 5,  # the default drain before a replica stops
        "url": "http://gw.example:8080/qwen",
    }
    path = f"/api/v1/deployments/{created['id']}/"
    changed = operator_client.patch(
        path, {"endpoint": {"hostname": "qwen.fleet.example", "port": "metrics"}}, format="json"
    )
    assert changed.status_code == 200, changed.json()
    assert changed.json()["endpoint"] == {
        "port": "metrics",
        "path_prefix": None,
        "hostname": "qwen.fleet.example",
        "drain_s": 5,
        "url": "http://qwen.fleet.example:8080/",
    }
    removed = operator_client.patch(path, {"endpoint": None}, format="json")
    assert removed.status_code == 200 and removed.json()["endpoint"] is None
    assert not Endpoint.objects.exists()
    summaries = list(
        Operation.objects.filter(kind="set_endpoint")
        .order_by("pk")
        .values_list("summary", flat=True)
    )
    assert summaries == [
        "Endpoint of qwen: http://gw.example:8080/qwen",
        "Endpoint of qwen: http://qwen.fleet.example:8080/",
        "Removed the endpoint of qwen",
    ]


@pytest.mark.parametrize(
    ("endpoint", "status", "code"),
    [
        ({"path_prefix": "qwen"}, 400, "endpoint.invalid"),
        ({"path_prefix": "/qwen/"}, 400, "endpoint.invalid"),
        ({"path_prefix": "/a b"}, 400, "endpoint.invalid"),
        ({"hostname": "Qwen.example"}, 400, "endpoint.invalid"),
        ({"hostname": "localhost"}, 400, "endpoint.invalid"),
        ({}, 400, "endpoint.invalid"),
        ({"path_prefix": "/x", "color": "red"}, 400, "endpoint.invalid"),
        ({"path_prefix": "/x", "port": "grpc"}, 422, "endpoint.port_unknown"),
    ],
)
def test_a_bad_endpoint_is_refused_and_nothing_is_created(operator_client, endpoint, status, code):
    answer = _create(operator_client, endpoint=endpoint)
    assert answer.status_code in (status, 400), answer.json()
    if answer.json()["code"] != "invalid":  # the schema's own check may come first
        assert_error(answer, status, code)
    assert not Deployment.objects.exists() and not Endpoint.objects.exists()


def test_a_taken_path_or_hostname_is_409_and_a_path_is_one_segment(operator_client):
    assert _create(operator_client, endpoint={"path_prefix": "/qwen"}).status_code == 201
    assert_error(
        _create(operator_client, name="a", endpoint={"path_prefix": "/qwen"}), 409, "endpoint.taken"
    )
    assert_error(
        _create(operator_client, name="b", endpoint={"path_prefix": "/qwen/v2"}),
        400,
        "endpoint.invalid",
    )
    assert _create(operator_client, name="c", endpoint={"path_prefix": "/qwen2"}).status_code == 201
    assert _create(operator_client, name="e", endpoint={"hostname": "e.example"}).status_code == 201
    assert_error(
        _create(operator_client, name="f", endpoint={"hostname": "e.example"}),
        409,
        "endpoint.taken",
    )
    assert sorted(Deployment.objects.values_list("name", flat=True)) == ["c", "e", "qwen"]


def test_a_workload_without_ports_has_no_endpoint(operator_client):
    answer = operator_client.post(
        "/api/v1/deployments/",
        {"name": "idle", "kind": "mps", "memory_mib": 1024, "endpoint": {"path_prefix": "/i"}},
        format="json",
    )
    assert_error(answer, 422, "endpoint.port_unknown")


@override_settings(FLEET_GATEWAY_SLOTS=1)
def test_when_every_backend_slot_is_taken_the_next_endpoint_is_409(operator_client):
    assert _create(operator_client, endpoint={"path_prefix": "/a"}).status_code == 201
    assert_error(
        _create(operator_client, name="b", endpoint={"path_prefix": "/b"}), 409, "endpoint.no_slot"
    )


def test_a_viewer_cannot_set_an_endpoint(operator_client, viewer_client):
    created = _create(operator_client).json()
    answer = viewer_client.patch(
        f"/api/v1/deployments/{created['id']}/", {"endpoint": {"path_prefix": "/v"}}, format="json"
    )
    assert answer.status_code == 403
    assert not Endpoint.objects.exists()


def test_the_gateway_holds_ready_copies_drains_leaving_ones_and_drops_the_rest(mig_gpu):
    Host.objects.filter(pk=mig_gpu.host_id).update(address="10.0.0.7")
    allocation = _placed(mig_gpu, workload=SERVER)
    endpoint_set(deployment_id=allocation.deployment_id, spec={"path_prefix": "/llm"})

    def servers() -> list[tuple[str, str, int, bool]]:
        (route,) = gateway_routes()
        assert route.path_prefix == "/llm"
        return [(s.name, s.address, s.port, s.draining) for s in route.servers]

    assert servers() == []  # no port reported yet
    _report(allocation, {"http": 20001, "metrics": 20002}, state="starting")
    assert servers() == []  # not ready: its check has not passed
    _report(allocation, {"http": 20001, "metrics": 20002})
    assert servers() == [(f"r{allocation.pk}", "10.0.0.7", 20001, False)]
    Allocation.objects.filter(pk=allocation.pk).update(state=AllocationState.RELEASING)
    assert servers() == [(f"r{allocation.pk}", "10.0.0.7", 20001, True)]  # leaving: drains
    Allocation.objects.filter(pk=allocation.pk).update(state=AllocationState.ACTIVE)
    Host.objects.filter(pk=mig_gpu.host_id).update(status=HostStatus.OFFLINE)
    assert servers() == []  # its host is gone


def test_a_copy_its_restarted_agent_rechecks_keeps_its_place_in_the_balancer(mig_gpu, tmp_path):
    """SIGKILL an agent and start it again: it adopts the replicas that kept running and
    reports them ``starting`` until their health check passes again. The gateway holds them as
    they are (the bench found every copy of the host out of the rotation for a sync, 503s);
    a copy that really (re)starts, its process new, leaves the rotation."""
    import time

    from fleet.allocations.workloads import workloads_record
    from fleet.endpoints.haproxy import config as hconfig
    from fleet.endpoints.haproxy.runtime import ServerState
    from fleet.endpoints.haproxy.sync import plan
    from tests.allocations.test_workloads import _status

    Host.objects.filter(pk=mig_gpu.host_id).update(address="10.0.0.7")
    allocation = _placed(mig_gpu, workload=SERVER)
    endpoint_set(deployment_id=allocation.deployment_id, spec={"path_prefix": "/llm"})

    def report(state: str, started_at: float) -> Any:
        status = {**_status(allocation.pk, state, started_at=started_at), "ports": {"http": 20001}}
        workloads_record(host_id=mig_gpu.host_id, statuses=[status], full=False)
        (route,) = gateway_routes()
        return route

    long_ago = time.time() - 600
    assert [s.hold for s in report("running", long_ago).servers] == [False]
    adopted = report("starting", long_ago)  # the restarted agent re-checks it
    assert [(s.name, s.hold, s.draining) for s in adopted.servers] == [
        (f"r{allocation.pk}", True, False)
    ]
    config = hconfig.GatewayConfig(listen="127.0.0.1:1", directory=tmp_path, slots=1)
    held = ServerState("ep_0", f"r{allocation.pk}", "10.0.0.7", 20001, True, False, False)
    commands, waiting, deferred = plan(config, [adopted], [held], {}, {"llm": "ep_0"}, {})
    assert (commands, waiting, deferred) == ([], 0, 0)  # it stays in the rotation
    commands, _, _ = plan(config, [adopted], [], {}, {"llm": "ep_0"}, {})
    assert [c for c in commands if c[0] == "add" and c[1] == "server"] == []  # and is not added
    assert report("starting", time.time()).servers == ()  # a new process: out until it passes


def test_the_routes_cost_two_queries_whatever_the_number_of_endpoints(
    mig_gpu, django_assert_num_queries
):
    Host.objects.filter(pk=mig_gpu.host_id).update(address="10.0.0.7")
    allocation = _placed(mig_gpu, workload=SERVER)
    endpoint_set(deployment_id=allocation.deployment_id, spec={"hostname": "a.example"})
    _report(allocation, {"http": 20001, "metrics": 20002})
    with django_assert_num_queries(2):
        (route,) = gateway_routes()
    assert route.hostname == "a.example" and len(route.servers) == 1


def test_a_request_to_the_gateway_reaches_the_ready_replica(mig_gpu, tmp_path):
    import shutil
    import tempfile
    from pathlib import Path

    from fleet.endpoints.gateway import Gateway
    from fleet.endpoints.haproxy.config import GatewayConfig
    from fleet.endpoints.haproxy.sync import sync
    from tests.endpoints.test_haproxy import Copy, free_port, get

    if not Path("/usr/sbin/haproxy").exists():
        pytest.skip("needs Debian's haproxy")
    replica = Copy("qwen says hi")
    directory = Path(tempfile.mkdtemp(prefix="fgw-"))
    config = GatewayConfig(
        listen=f"127.0.0.1:{free_port()}", directory=directory, slots=4, metrics=None
    )
    gateway = Gateway(config, haproxy="/usr/sbin/haproxy")
    try:
        Host.objects.filter(pk=mig_gpu.host_id).update(address="127.0.0.1")
        allocation = _placed(mig_gpu, workload=SERVER)
        endpoint_set(deployment_id=allocation.deployment_id, spec={"path_prefix": "/qwen"})
        _report(allocation, {"http": replica.port, "metrics": free_port()})
        gateway.start()
        assert get(config, "/qwen/v1")[0] == 404  # a fresh gateway knows no endpoint yet
        result = sync(gateway.api, config, gateway_routes())  # what Gateway.once does
        assert not result.errors, result.errors
        assert get(config, "/qwen/v1") == (200, "qwen says hi")
    finally:
        gateway.close()
        replica.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_deployment_being_deleted_gets_no_endpoint(operator_client):
    created = _create(operator_client).json()
    Deployment.objects.filter(pk=created["id"]).update(deleting=True)
    answer = operator_client.patch(
        f"/api/v1/deployments/{created['id']}/", {"endpoint": {"path_prefix": "/x"}}, format="json"
    )
    assert_error(answer, 409, "deployment.deleting")
    assert not Endpoint.objects.exists()
