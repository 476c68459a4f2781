"""POST /deployments/{id}/place-all: every unplaced replica that fits now, and why the rest not."""

from __future__ import annotations

import pytest

from fleet.allocations.models import Allocation
from fleet.partitioning.models import Partition
from tests.factories import GpuFactory, HostFactory
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

SEVEN_SMALL = {"mode": "mig", "instances": [{"profile": "1g.10gb", "start": s} for s in range(7)]}


def create(client, **body):
    response = client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def place_all(client, deployment_id):
    return client.post(f"/api/v1/deployments/{deployment_id}/place-all", {}, format="json")


@pytest.fixture
def four_free_slices(operator_client):
    """An H100 in seven 1g.10gb slices, three of them taken by another deployment."""
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    response = operator_client.put(f"/api/v1/gpus/{gpu.pk}/layout", SEVEN_SMALL, format="json")
    assert response.status_code in (200, 202), response.json()
    create(operator_client, name="other", kind="mig", profile="1g.10gb", replicas=3, auto=True)
    return gpu


def test_place_all_places_what_fits_and_says_why_the_rest_does_not(
    operator_client, four_free_slices
):
    chat = create(operator_client, name="chat", kind="mig", profile="1g.10gb", replicas=6)

    response = place_all(operator_client, chat["id"])

    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["deployment"] == chat["id"]
    assert [op["kind"] for op in body["placed"]] == ["place"] * 4
    assert body["unplaced"] == 2
    assert body["reasons"], body
    reason = body["reasons"][0]
    assert set(reason) == {"code", "message", "details"}
    assert reason["code"] == "placement.no_free_space"
    assert reason["details"]["refusals"] == 1
    assert Allocation.objects.filter(deployment_id=chat["id"]).count() == 4
    free = Partition.objects.filter(gpu=four_free_slices, allocations__isnull=True)
    assert not free.exists()


def test_place_all_of_a_deployment_that_fits_entirely_leaves_no_reasons(
    operator_client, four_free_slices
):
    chat = create(operator_client, name="chat", kind="mig", profile="1g.10gb", replicas=2)

    body = place_all(operator_client, chat["id"]).json()

    assert (len(body["placed"]), body["unplaced"], body["reasons"]) == (2, 0, [])


def test_when_nothing_fits_place_all_is_409_with_the_reasons_and_writes_nothing(
    operator_client, four_free_slices
):
    big = create(operator_client, name="big", kind="mig", profile="7g.80gb", replicas=2)
    before = snapshot_rows()

    body = assert_error(place_all(operator_client, big["id"]), 409, "place_all.nothing_fits")

    assert body["details"]["unplaced"] == 2
    assert body["details"]["violations"][0]["code"] == "placement.no_free_space"
    assert snapshot_rows() == before


def test_a_container_with_no_host_to_run_it_gets_the_runtime_reason(operator_client):
    gpu = GpuFactory(host=HostFactory(name="proc-01", runtime="process"))
    operator_client.put(f"/api/v1/gpus/{gpu.pk}/layout", SEVEN_SMALL, format="json")
    llm = create(
        operator_client,
        name="llm",
        kind="mig",
        profile="1g.10gb",
        workload={"runtime": "container", "image": "registry.example/llm:1"},
    )

    body = assert_error(place_all(operator_client, llm["id"]), 409, "place_all.nothing_fits")

    (violation,) = body["details"]["violations"]
    assert violation["code"] == "placement.runtime"
    assert violation["message"] == (
        "proc-01 runs workloads with the process runtime; this deployment needs container."
    )
    assert "proc-01 runs workloads with the process runtime" in body["message"]


def test_a_fully_placed_deployment_is_409(operator_client, four_free_slices):
    chat = create(operator_client, name="chat", kind="mig", profile="1g.10gb", auto=True)

    assert_error(place_all(operator_client, chat["id"]), 409, "deployment.fully_placed")


def test_viewers_cannot_place_all_and_unknown_deployments_are_404(
    operator_client, viewer_client, four_free_slices
):
    chat = create(operator_client, name="chat", kind="mig", profile="1g.10gb")

    assert_error(place_all(viewer_client, chat["id"]), 403)
    assert_error(place_all(operator_client, 999_999), 404, "deployment.not_found")
    assert not Allocation.objects.filter(deployment_id=chat["id"]).exists()


def test_place_all_is_in_the_openapi_schema(viewer_client):
    schema = viewer_client.get("/api/schema/", {"format": "json"}).json()

    operation = schema["paths"]["/api/v1/deployments/{id}/place-all"]["post"]
    assert set(operation["responses"]) >= {"202", "403", "404", "409"}
