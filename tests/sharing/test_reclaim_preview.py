"""``GET /api/v1/queue/reclaim/{deployment}``: what a reclaim would do now for a replica its
team's deserved share entitles (a preview: nothing changes)."""

from __future__ import annotations

import pytest

from fleet.allocations.services import DeploymentRequest
from tests.helpers import assert_error, snapshot_rows

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
