"""``PATCH /api/v1/deployments/{id}/``: operators scale; every refusal is the error envelope and
changes nothing; the schema describes it."""

from __future__ import annotations

import pytest

from fleet.allocations.models import Allocation, AllocationState, Deployment, WorkloadState
from fleet.allocations.services import (
    DeploymentRequest,
    deployment_create,
    deployment_delete,
    deployment_place,
)
from fleet.core.models import Operation
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory, allow_process
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

PROCESS = {"runtime": "process", "command": ["/bin/sh", "-c", "sleep 1000"], "stop_grace_s": 5}


@pytest.fixture
def worker():
    """A demo-like deployment: two MPS replicas placed, their processes running."""
    allow_process()
    host = HostFactory(runtime="process", process_runtime=True)
    gpu = GpuFactory(host=host, product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    deployment = deployment_create(
        name="feature-worker",
        request=DeploymentRequest(kind="mps", memory_mib=2048, max_compute_percent=10),
        replicas=2,
        workload=PROCESS,
    )
    for _ in range(2):
        deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)
    Allocation.objects.filter(deployment=deployment).update(workload_state=WorkloadState.RUNNING)
    return deployment


def patch(client, deployment_id, body):
    return client.patch(f"/api/v1/deployments/{deployment_id}/", body, format="json")


def test_an_operator_scales_up_and_gets_the_deployment_back(operator_client, worker):
    response = patch(operator_client, worker.pk, {"replicas": 3})

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["replicas"] == 3 and body["placed_replicas"] == 2 and body["status"] == "unplaced"
    assert body["auto_place"] is False
    scale = Operation.objects.get(deployment=worker, kind="scale")
    assert scale.requested_by is not None and scale.requested_by.username == "operator-user"


def test_an_operator_scales_down_and_running_replicas_go_releasing(operator_client, worker):
    response = patch(operator_client, worker.pk, {"replicas": 1})

    assert response.status_code == 200, response.json()
    assert response.json()["replicas"] == 1 and response.json()["placed_replicas"] == 1
    released = Allocation.objects.get(deployment=worker, replica=1)
    assert released.state == AllocationState.RELEASING  # its process still stops


def test_an_auto_placed_deployment_scaled_up_is_placed_at_once(operator_client):
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    created = operator_client.post(
        "/api/v1/deployments/",
        {"name": "auto", "kind": "mps", "memory_mib": 1024, "replicas": 1, "auto": True},
        format="json",
    ).json()
    assert created["auto_place"] is True

    response = patch(operator_client, created["id"], {"replicas": 3})

    assert response.status_code == 200, response.json()
    assert response.json()["placed_replicas"] == 3


def test_viewers_cannot_scale(viewer_client, worker):
    before = snapshot_rows()
    assert_error(patch(viewer_client, worker.pk, {"replicas": 3}), 403, "auth.forbidden")
    assert snapshot_rows() == before


def test_anonymous_clients_cannot_scale(anon_client, worker):
    assert_error(patch(anon_client, worker.pk, {"replicas": 3}), 401)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"replicas": 0}, "deployment.replicas_invalid"),
        ({"replicas": 1001}, "deployment.replicas_invalid"),
        ({"replicas": "3"}, "deployment.replicas_invalid"),
        ({"replicas": None}, "deployment.replicas_invalid"),
        ({}, "deployment.replicas_required"),
        ([3], "malformed_request"),
        ({"replicas": 3, "workload": PROCESS}, "deployment.one_change"),
        ({"workload": {"runtime": "process"}}, "workload.invalid"),
        ({"workload": PROCESS, "rollout": {"max_unavailable": -1}}, "rollout.invalid"),
        ({"memory_mib": 4096}, "deployment.field_immutable"),
        ({"replicas": 3, "kind": "gpu"}, "deployment.field_immutable"),
        ({"replicas": 3, "shiny": True}, "deployment.field_unknown"),
    ],
)
def test_bad_input_is_a_400_envelope_and_changes_nothing(operator_client, worker, body, code):
    before = snapshot_rows()
    assert_error(patch(operator_client, worker.pk, body), 400, code)
    assert snapshot_rows() == before


def test_a_workload_change_starts_a_rolling_update(operator_client, viewer_client, worker):
    assert_error(patch(viewer_client, worker.pk, {"workload": PROCESS}), 403)
    same = patch(operator_client, worker.pk, {"workload": PROCESS}).json()
    assert same["status"] == "succeeded" and "already run" in same["reason"]
    v2 = {**PROCESS, "command": ["/bin/sh", "-c", "sleep 2000"]}
    response = patch(operator_client, worker.pk, {"workload": v2, "rollout": {"max_surge": 2}})
    assert response.status_code == 202, response.json()
    assert response.json()["kind"] == "rollout" and response.json()["status"] == "dispatched"
    again = patch(operator_client, worker.pk, {"workload": PROCESS})
    assert_error(again, 409, "rollout.in_progress")


def test_a_deployment_being_deleted_refuses_with_409(operator_client, worker):
    deployment_delete(deployment_id=worker.pk)
    assert Deployment.objects.get(pk=worker.pk).deleting
    before = snapshot_rows()
    assert_error(patch(operator_client, worker.pk, {"replicas": 3}), 409, "deployment.deleting")
    assert snapshot_rows() == before


def test_a_missing_deployment_is_a_404(operator_client):
    assert_error(patch(operator_client, 999_999, {"replicas": 3}), 404, "deployment.not_found")


def test_put_is_not_offered(operator_client, worker):
    response = operator_client.put(f"/api/v1/deployments/{worker.pk}/", {}, format="json")
    assert_error(response, 405, "method_not_allowed")


def test_the_schema_describes_the_patch(operator_client):
    schema = operator_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/v1/deployments/{id}/"]["patch"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    name = body.rsplit("/", 1)[-1]
    replicas = schema["components"]["schemas"][name]["properties"]["replicas"]
    assert replicas["minimum"] == 1 and replicas["maximum"] == 1000
    assert {"200", "400", "403", "404", "409", "422"} <= set(operation["responses"])
    assert "rolling update" in operation["description"]
    assert {"202"} <= set(operation["responses"])
