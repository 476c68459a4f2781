"""POST /deployments/ with ``wait``: the replicas that fit are placed, the others wait in the
queue (not a 422), where the queue places them as capacity frees and a team within its deserved
share takes capacity back from borrowers."""

from __future__ import annotations

import pytest

from fleet.allocations.models import Allocation, Deployment
from fleet.core.models import Operation, OperationKind
from fleet.sharing.placing import queue_place
from fleet.sharing.reclaiming import reclaims_start
from tests.api.test_place_all import SEVEN_SMALL, create, four_free_slices  # noqa: F401
from tests.helpers import assert_error
from tests.sharing.conftest import lent_whole  # noqa: F401

pytestmark = pytest.mark.django_db


def test_what_fits_is_placed_and_the_rest_waits(operator_client, four_free_slices):  # noqa: F811
    body = create(
        operator_client, name="chat", kind="mig", profile="1g.10gb", replicas=6, wait=True
    )
    assert body["auto_place"] is True and body["replicas"] == 6
    assert body["placed_replicas"] == 4  # the four free slices
    assert Allocation.objects.filter(deployment_id=body["id"]).count() == 4
    # The two waiting are in the queue.
    waiting = operator_client.get("/api/v1/queue/").json()["waiting"]
    assert sorted((w["deployment_name"], w["replica"]) for w in waiting) == [
        ("chat", 4),
        ("chat", 5),
    ], waiting
    # Capacity frees: the queue places them (beat's fleet.place_queue).
    other = Deployment.objects.get(name="other")
    response = operator_client.patch(
        f"/api/v1/deployments/{other.pk}/", {"replicas": 1}, format="json"
    )
    assert response.status_code == 200, response.json()
    Allocation.objects.filter(deployment=other, state="releasing").delete()  # agent: released
    assert len(queue_place()) == 2
    assert Allocation.objects.placed().filter(deployment_id=body["id"]).count() == 6


def test_nothing_fitting_is_not_an_error_with_wait(operator_client, four_free_slices):  # noqa: F811
    refused = operator_client.post(
        "/api/v1/deployments/",
        {"name": "big", "kind": "mig", "profile": "7g.80gb", "replicas": 1, "auto": True},
        format="json",
    )
    assert_error(refused, 422)  # plain `auto`: all or nothing, as before
    assert not Deployment.objects.filter(name="big").exists()
    body = create(operator_client, name="big", kind="mig", profile="7g.80gb", wait=True)
    assert body["placed_replicas"] == 0 and body["status"] != "placed"


def test_a_waiting_replica_within_its_deserved_share_starts_a_reclaim(lent_whole, admin_client):  # noqa: F811
    ads = lent_whole["ads"]
    Deployment.objects.filter(pk=lent_whole["serve"].pk).delete()  # ads asks through the API
    body = create(admin_client, name="serve", kind="gpu", gpu_count=1, team=ads.pk, wait=True)
    assert body["placed_replicas"] == 0
    [pk] = reclaims_start()
    operation = Operation.objects.get(pk=pk)
    assert operation.kind == OperationKind.RECLAIM and operation.deployment_id == body["id"]
    assert operation.payload["lender"]["name"] == "ads"


def test_wait_is_a_boolean(operator_client):
    response = operator_client.post(
        "/api/v1/deployments/",
        {"name": "x", "kind": "mps", "memory_mib": 100, "wait": "soon"},
        format="json",
    )
    assert_error(response, 400)
    assert not Deployment.objects.exists()
