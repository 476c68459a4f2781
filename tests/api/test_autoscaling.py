"""Autoscaling and traffic through the API (issues 24 and 23): the policy set on create and by
PATCH, read back with what the last evaluation found, refused with the field named, removed
with null; a viewer cannot set it; the endpoint's traffic per deployment."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.autoscaling.models import ScalingPolicy
from fleet.autoscaling.services import autoscale_evaluate
from fleet.endpoints.metering import Sample
from fleet.endpoints.models import Endpoint
from fleet.endpoints.traffic import traffic_record
from tests.allocations.test_ports import SERVER
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

POLICY = {"min": 1, "max": 4, "target": {"requests_per_replica_per_s": 4}}
BODY = {
    "name": "chat",
    "kind": "mps",
    "memory_mib": 4096,
    "workload": SERVER,
    "endpoint": {"path_prefix": "/chat"},
}


def _create(client: Any, **extra: Any) -> Any:
    return client.post("/api/v1/deployments/", {**BODY, **extra}, format="json")


def test_a_policy_is_set_on_create_read_changed_and_removed(operator_client):
    created = _create(operator_client, autoscaling=POLICY)
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["autoscaling"] == {
        **POLICY,
        "scale_out_cooldown_s": 30,
        "scale_in_cooldown_s": 300,
        "activation_timeout_s": 300,
        "state": "steady",
        "reason": "",
        "value": None,
        "evaluated_at": None,
    }
    url = f"/api/v1/deployments/{body['id']}/"
    autoscale_evaluate(deployment_id=body["id"])  # no gateway: no metric
    read = operator_client.get(url).json()["autoscaling"]
    assert read["state"] == "no_metric" and read["evaluated_at"] is not None
    changed = operator_client.patch(
        url, {"autoscaling": {**POLICY, "max": 6, "scale_in_cooldown_s": 60}}, format="json"
    )
    assert changed.status_code == 200, changed.json()
    assert changed.json()["autoscaling"]["max"] == 6
    assert changed.json()["replicas"] == 1  # setting a policy changes no count by itself
    removed = operator_client.patch(url, {"autoscaling": None}, format="json")
    assert removed.status_code == 200 and removed.json()["autoscaling"] is None
    assert not ScalingPolicy.objects.exists()


def test_a_bad_policy_is_refused_and_nothing_is_created(operator_client):
    answer = _create(operator_client, name="bad", autoscaling={**POLICY, "max": 0})
    assert answer.status_code == 400
    assert_error(answer, 400)
    answer = _create(operator_client, name="bad", autoscaling={**POLICY, "target": {"qps": 1}})
    assert answer.status_code == 400, answer.json()
    assert operator_client.get("/api/v1/deployments/?name=bad").json()["count"] == 0
    no_endpoint = {**BODY, "name": "bare"}
    no_endpoint.pop("endpoint")
    answer = operator_client.post(
        "/api/v1/deployments/", {**no_endpoint, "autoscaling": POLICY}, format="json"
    )
    assert_error(answer, 422, "autoscaling.needs_endpoint")
    assert operator_client.get("/api/v1/deployments/?name=bare").json()["count"] == 0


def test_a_viewer_cannot_set_a_policy(operator_client, viewer_client):
    created = _create(operator_client).json()
    answer = viewer_client.patch(
        f"/api/v1/deployments/{created['id']}/", {"autoscaling": POLICY}, format="json"
    )
    assert answer.status_code == 403
    assert not ScalingPolicy.objects.exists()


def test_the_traffic_of_an_endpoint_as_the_gateways_measured_it(operator_client, viewer_client):
    created = _create(operator_client).json()
    url = f"/api/v1/deployments/{created['id']}/traffic"
    assert_error(viewer_client.get(url), 404, "traffic.not_available")
    slot = Endpoint.objects.get(deployment_id=created["id"]).slot
    traffic_record(
        "gw-1",
        [
            Sample(slot, 0, "ready", 9.5, 0.5, 3, 1, None),
            Sample(slot, 77, "draining", 9.0, 0.0, 3, 0, 12.0),
        ],
    )
    body = viewer_client.get(url).json()
    assert body["requests_per_s"] == 9.5 and body["errors_per_s"] == 0.5
    assert (body["in_flight"], body["queued"], body["gateways"]) == (3, 1, 1)
    assert body["replicas"] == [
        {
            "allocation": 77,
            "state": "draining",
            "requests_per_s": 9.0,
            "errors_per_s": 0.0,
            "in_flight": 3,
            "response_ms": 12.0,
        }
    ]
