"""``GET /api/v1/queue/reclaim/{deployment}``: what a reclaim would do now for a replica its
team's deserved share entitles (a preview: nothing changes)."""

from __future__ import annotations

import pytest

from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.teams import team_create, team_quota_set
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

WHOLE = DeploymentRequest(kind="gpu", gpu_count=1)


@pytest.fixture
def lent_fleet(settings):
    """Two GPUs, both held by *search*: one guaranteed, one borrowed; *ads* (deserved 1) waits."""
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 0
    host = HostFactory()
    gpus = [GpuFactory(host=host) for _ in range(2)]
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    search = team_create(name="search")
    team_quota_set(team_id=search.pk, quota={"gpus": 1, "limit": {"gpus": 2}})
    train = deployment_create(name="train", request=WHOLE, replicas=2, team_id=search.pk)
    for gpu in gpus:
        deployment_place(deployment_id=train.pk, gpu_id=gpu.pk)
    ads = team_create(name="ads")
    team_quota_set(team_id=ads.pk, quota={"gpus": 1})
    serve = deployment_create(name="serve", request=WHOLE, replicas=1, team_id=ads.pk)
    return {"serve": serve, "train": train, "borrowed": Allocation.objects.get(borrowed=True)}


def test_a_reclaim_would_stop_the_borrowed_replica_and_the_preview_changes_nothing(
    viewer_client, lent_fleet
):
    before = snapshot_rows()
    response = viewer_client.get(f"/api/v1/queue/reclaim/{lent_fleet['serve'].pk}")
    assert response.status_code == 200, response.json()
    body = response.json()
    borrowed = lent_fleet["borrowed"]
    assert body["action"] == "stop" and body["moves"] == []
    assert [s["allocation"] for s in body["stops"]] == [borrowed.pk]
    assert body["target"]["gpu"] == borrowed.gpu_id
    assert snapshot_rows() == before


def test_a_young_borrowed_replica_is_not_stopped(viewer_client, lent_fleet, settings):
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 3600
    body = viewer_client.get(f"/api/v1/queue/reclaim/{lent_fleet['serve'].pk}").json()
    assert (body["action"], body["stops"]) == ("none", [])


def test_a_replica_past_its_deserved_share_does_not_reclaim(viewer_client, lent_fleet):
    body = viewer_client.get(f"/api/v1/queue/reclaim/{lent_fleet['train'].pk}").json()
    assert (body["action"], body["code"]) == ("none", "reclaim.not_entitled")


def test_an_unknown_deployment_is_a_404(viewer_client, db):
    assert_error(viewer_client.get("/api/v1/queue/reclaim/999999"), 404, "deployment.not_found")
