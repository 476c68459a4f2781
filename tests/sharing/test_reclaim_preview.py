"""``/api/v1/queue/reclaim/{deployment}``: what a reclaim would do now for a replica its team's
deserved share entitles (``GET``, a preview: nothing changes), and starting it now (``POST``,
fleet operators; planned when it is sent, with the sweep's refusals)."""

from __future__ import annotations

import pytest

from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest
from fleet.core.models import Operation
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory
from tests.helpers import assert_error, snapshot_rows
from tests.sharing.conftest import run_reclaim

pytestmark = pytest.mark.django_db

WHOLE = DeploymentRequest(kind="gpu", gpu_count=1)


def test_a_reclaim_would_stop_the_borrowed_replica_and_the_preview_changes_nothing(
    viewer_client, lent_whole
):
    before = snapshot_rows()
    response = viewer_client.get(f"/api/v1/queue/reclaim/{lent_whole['serve'].pk}")
    assert response.status_code == 200, response.json()
    body = response.json()
    borrowed = lent_whole["borrowed"]
    assert body["action"] == "stop" and body["moves"] == []
    assert [s["allocation"] for s in body["stops"]] == [borrowed.pk]
    assert body["target"]["gpu"] == borrowed.gpu_id
    assert snapshot_rows() == before


def test_a_young_borrowed_replica_is_not_stopped(viewer_client, lent_whole, settings):
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 3600
    body = viewer_client.get(f"/api/v1/queue/reclaim/{lent_whole['serve'].pk}").json()
    assert (body["action"], body["stops"]) == ("none", [])


def test_a_replica_past_its_deserved_share_does_not_reclaim(viewer_client, lent_whole):
    body = viewer_client.get(f"/api/v1/queue/reclaim/{lent_whole['train'].pk}").json()
    assert (body["action"], body["code"]) == ("none", "reclaim.not_entitled")


def test_an_unknown_deployment_is_a_404(viewer_client, db):
    assert_error(viewer_client.get("/api/v1/queue/reclaim/999999"), 404, "deployment.not_found")


def test_an_operator_starts_the_reclaim_and_it_places_the_replica(operator_client, lent_whole):
    serve, borrowed = lent_whole["serve"], lent_whole["borrowed"]
    response = operator_client.post(f"/api/v1/queue/reclaim/{serve.pk}")
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["kind"] == "reclaim" and body["status"] == "dispatched"
    operation = Operation.objects.get(pk=body["id"])
    assert operation.requested_by is not None
    assert [s["allocation"] for s in operation.payload["planned_stops"]] == [borrowed.pk]
    # One at a time for a deployment: a second click is refused, nothing more starts.
    assert_error(
        operator_client.post(f"/api/v1/queue/reclaim/{serve.pk}"), 409, "reclaim.in_progress"
    )
    operation = run_reclaim(operation)
    assert operation.status == "succeeded", operation.payload["log"]
    placed = Allocation.objects.get(deployment=serve)
    assert placed.gpu_id == borrowed.gpu_id and not placed.borrowed


def test_a_reclaim_that_would_not_place_it_touches_nothing(operator_client, lent_whole, settings):
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 3600  # too young to stop: no plan gains anything
    before = snapshot_rows()
    serve, train = lent_whole["serve"], lent_whole["train"]
    assert_error(operator_client.post(f"/api/v1/queue/reclaim/{serve.pk}"), 409, "reclaim.no_gain")
    assert_error(
        operator_client.post(f"/api/v1/queue/reclaim/{train.pk}"), 409, "reclaim.not_entitled"
    )
    assert_error(operator_client.post("/api/v1/queue/reclaim/999999"), 404, "deployment.not_found")
    assert snapshot_rows() == before


def test_a_replica_that_fits_is_not_reclaimed_for(operator_client, lent_whole):
    free = GpuFactory(host=lent_whole["borrowed"].gpu.host)
    gpu_set_layout(gpu_id=free.pk, spec=LayoutSpec(mode="dedicated"))
    before = snapshot_rows()
    response = operator_client.post(f"/api/v1/queue/reclaim/{lent_whole['serve'].pk}")
    assert_error(response, 409, "reclaim.fits_now")
    assert snapshot_rows() == before


def test_a_viewer_may_not_start_one(viewer_client, lent_whole):
    before = snapshot_rows()
    response = viewer_client.post(f"/api/v1/queue/reclaim/{lent_whole['serve'].pk}")
    assert_error(response, 403, "auth.forbidden")
    assert snapshot_rows() == before
