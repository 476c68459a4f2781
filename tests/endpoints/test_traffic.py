"""The endpoints' traffic: what the gateways record every second, read per deployment and per
copy; several gateways add up, a stopped gateway's readings stop counting; and on a real
HAProxy, the counters of the requests sent through it."""

from __future__ import annotations

import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from fleet.endpoints.gateway import Gateway
from fleet.endpoints.haproxy.config import GatewayConfig
from fleet.endpoints.haproxy.runtime import read_counters
from fleet.endpoints.haproxy.sync import sync
from fleet.endpoints.metering import Sample
from fleet.endpoints.models import Traffic
from fleet.endpoints.selectors import gateway_routes
from fleet.endpoints.services import endpoint_set
from fleet.endpoints.traffic import deployment_traffic, traffic_record
from fleet.inventory.models import Host
from tests.allocations.test_ports import SERVER, _report
from tests.allocations.test_workloads import _placed
from tests.allocations.test_workloads import mig_gpu as mig_gpu  # the fixture

pytestmark = pytest.mark.django_db


def sample(slot: int, allocation_id: int, rate: float | None, **extra) -> Sample:
    values = {
        "state": "ready",
        "errors_per_s": 0.0,
        "in_flight": 1,
        "queued": 0,
        "response_ms": 20.0,
        **extra,
    }
    return Sample(slot=slot, allocation_id=allocation_id, requests_per_s=rate, **values)


def _endpoint(mig_gpu) -> tuple[int, int, int]:
    allocation = _placed(mig_gpu, workload=SERVER)
    endpoint = endpoint_set(deployment_id=allocation.deployment_id, spec={"path_prefix": "/q"})
    assert endpoint is not None
    return allocation.deployment_id, endpoint.slot, allocation.pk


def test_two_gateways_add_up_and_a_stopped_one_stops_counting(mig_gpu):
    deployment_id, slot, copy = _endpoint(mig_gpu)
    assert deployment_traffic(deployment_id) is None  # nobody measures it
    traffic_record("gw-a", [sample(slot, copy, 6.0, response_ms=10.0), sample(slot, 0, 6.5)])
    traffic_record("gw-b", [sample(slot, copy, 2.0, response_ms=50.0), sample(slot, 0, 2.0)])
    seen = deployment_traffic(deployment_id)
    assert seen is not None and seen.gateways == 2
    assert seen.requests_per_s == 8.5  # the backends: every request, served or not yet
    assert seen.replicas[copy].requests_per_s == 8.0 and seen.replicas[copy].in_flight == 2
    assert seen.in_flight == 2  # the backends' own count
    assert seen.replicas[copy].response_ms == 20.0  # (6 x 10 + 2 x 50) / 8
    Traffic.objects.filter(gateway="gw-b").update(updated_at=timezone.now() - timedelta(seconds=30))
    after = deployment_traffic(deployment_id)
    assert after is not None and after.gateways == 1 and after.requests_per_s == 6.5


def test_a_reading_replaces_the_last_and_drops_copies_and_slots_that_are_gone(mig_gpu):
    deployment_id, slot, copy = _endpoint(mig_gpu)
    assert traffic_record("gw", [sample(slot, copy, 1.0), sample(slot, 99, 1.0)]) == 2
    assert traffic_record("gw", [sample(slot, copy, 3.0), sample(slot + 1, 5, 1.0)]) == 1
    rows = list(Traffic.objects.values_list("allocation_id", "requests_per_s"))
    assert rows == [(copy, 3.0)]  # copy 99 went; slot + 1 holds no endpoint
    seen = deployment_traffic(deployment_id)
    assert seen is not None and list(seen.replicas) == [copy]


def test_a_copy_not_yet_measured_has_no_rate_not_zero(mig_gpu):
    deployment_id, slot, copy = _endpoint(mig_gpu)
    traffic_record("gw", [sample(slot, copy, None, response_ms=None)])
    seen = deployment_traffic(deployment_id)
    assert seen is not None
    assert seen.requests_per_s is None and seen.replicas[copy].response_ms is None


def _settled(gateway: Gateway, requests: int, within_s: float = 5.0) -> None:
    """Wait until HAProxy has counted every request on the server and its backend alike:
    it closes a stream's accounting just after the client has its response."""
    deadline = time.monotonic() + within_s
    while True:
        rows = [row for row in read_counters(gateway.api) if row.backend.startswith("ep_")]
        totals = {row.requests for row in rows if row.requests}
        in_flight = sum(row.in_flight for row in rows)
        if totals == {requests} and in_flight == 0:
            return
        assert time.monotonic() < deadline, f"HAProxy's counters did not settle: {rows}"
        time.sleep(0.02)


def test_the_gateway_measures_the_requests_sent_through_a_real_haproxy(mig_gpu):
    from tests.endpoints.test_haproxy import Copy, free_port, get

    if not Path("/usr/sbin/haproxy").exists():
        pytest.skip("needs Debian's haproxy")
    replica = Copy("hi", delay_s=0.01)
    directory = Path(tempfile.mkdtemp(prefix="fgw-"))
    config = GatewayConfig(
        listen=f"127.0.0.1:{free_port()}", directory=directory, slots=4, metrics=None
    )
    gateway = Gateway(config, haproxy="/usr/sbin/haproxy", name="gw-test")
    try:
        Host.objects.filter(pk=mig_gpu.host_id).update(address="127.0.0.1")
        deployment_id, _slot, copy = _endpoint(mig_gpu)
        from fleet.allocations.models import Allocation

        _report(Allocation.objects.get(pk=copy), {"http": replica.port, "metrics": free_port()})
        gateway.start()
        assert not sync(gateway.api, config, gateway_routes()).errors
        assert gateway.measure() == 2  # the copy and the backend, no rate yet
        for _ in range(30):
            assert get(config, "/q/x") == (200, "hi")
        _settled(gateway, requests=30)
        gateway.measure()
        seen = deployment_traffic(deployment_id)
        assert seen is not None and seen.gateways == 1
        assert seen.requests_per_s and seen.requests_per_s > 0
        assert seen.replicas[copy].requests_per_s == seen.requests_per_s
        assert seen.replicas[copy].state == "ready" and seen.in_flight == 0
        assert seen.replicas[copy].response_ms is not None
        assert replica.served == 30
    finally:
        gateway.close()
        replica.stop()
        shutil.rmtree(directory, ignore_errors=True)
