"""A replica of a deployment with an endpoint drains before it stops (issue 23): its endpoint's
``drain_s`` (default 5) goes to the agent with each replica, which keeps it up, reported
stopping (out of the balancers' rotation), that long before SIGTERM. A change reaches the
agents at once; a bad value is refused and changes nothing."""

from __future__ import annotations

import pytest

from fleet.agents.documents import host_desired_state
from fleet.endpoints.models import Endpoint
from fleet.endpoints.services import endpoint_set
from fleet.inventory.models import Host
from tests.allocations.test_workloads import mig_gpu as mig_gpu  # the fixture
from tests.endpoints.test_traffic import _endpoint

pytestmark = pytest.mark.django_db


def drains(host: Host) -> list[int | None]:
    desired = host_desired_state(host)
    return [a.get("drain_s") for g in desired["gpus"].values() for a in g["allocations"]]


def test_the_agent_is_told_each_replica_s_drain_and_a_change_is_sent_at_once(
    mig_gpu, django_capture_on_commit_callbacks
):
    deployment_id, _, _ = _endpoint(mig_gpu)
    host = Host.objects.get(pk=mig_gpu.host_id)
    assert drains(host) == [5]
    before = host.desired_generation
    with django_capture_on_commit_callbacks(execute=True):
        endpoint_set(deployment_id=deployment_id, spec={"path_prefix": "/q", "drain_s": 30})
    host.refresh_from_db()
    assert drains(host) == [30] and host.desired_generation == before + 1
    Endpoint.objects.filter(deployment_id=deployment_id).delete()
    assert drains(host) == [None]  # no endpoint: stopped at once


def test_a_drain_out_of_bounds_is_refused_and_changes_nothing(mig_gpu, operator_client):
    deployment_id, _, _ = _endpoint(mig_gpu)
    path = f"/api/v1/deployments/{deployment_id}/"
    for bad in (-1, 301, "5", 2.5):
        body = {"endpoint": {"path_prefix": "/q", "drain_s": bad}}
        answer = operator_client.patch(path, body, format="json")
        assert answer.status_code == 400, answer.json()
        assert "drain_s" in str(answer.json()), answer.json()
    assert Endpoint.objects.get(deployment_id=deployment_id).drain_s == 5
    body = {"endpoint": {"path_prefix": "/q", "drain_s": 0}}
    answer = operator_client.patch(path, body, format="json")
    assert answer.status_code == 200 and answer.json()["endpoint"]["drain_s"] == 0
