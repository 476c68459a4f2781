"""``/capacity/repack``: a proposal any role reads, an operator applies; bad input is a 400 with
the error envelope, an impossible repack a 200 that says why (409 when applied)."""

from __future__ import annotations

import pytest

from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.models import Operation
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

URL = "/api/v1/capacity/repack"
H100 = "h100-sxm5-80gb"


@pytest.fixture
def fleet():
    """Two H100s with a 1g.10gb replica each (host runtime none: moves switch at once)."""
    host = HostFactory(runtime="none")
    gpus = [GpuFactory(host=host, product_key=H100) for _ in range(2)]
    small = deployment_create(
        name="small", request=DeploymentRequest(kind="mig", profile="1g.10gb"), replicas=2
    )
    for gpu in gpus:
        gpu_set_layout(
            gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("1g.10gb", 0),))
        )
        deployment_place(deployment_id=small.pk, partition_id=Partition.objects.get(gpu=gpu).pk)
    return gpus


def test_any_role_reads_a_proposal_with_cost_bound_and_method(fleet, viewer_client):
    response = viewer_client.get(URL, {"product": H100, "free_gpus": 1})

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["feasible"] is True and body["method"] == "cp-sat"
    assert body["cost"] == body["bound"] == 1 and body["status"] == "optimal"
    assert len(body["freed"]) == 1 and body["freed"][0]["gpu"] in {g.pk for g in fleet}
    [move] = body["moves"]
    assert move["deployment"] == "small" and move["kind"] == "mig"
    assert move["to_gpu"] != move["from_gpu"] == body["freed"][0]["gpu"]
    assert not Operation.objects.filter(kind__in=["repack", "move"]).exists()


def test_the_product_may_be_named_as_the_fleet_shows_it(fleet, viewer_client):
    name = fleet[0].product_name
    response = viewer_client.get(URL, {"product": name.upper(), "free_gpus": 1})
    assert response.status_code == 200 and response.json()["product_key"] == H100


def test_an_impossible_repack_says_why(fleet, viewer_client):
    response = viewer_client.get(URL, {"product": H100, "free_gpus": 2})

    body = response.json()
    assert response.status_code == 200
    assert body["feasible"] is False and body["moves"] == [] and body["reason"]


@pytest.mark.parametrize(
    "query",
    [
        {"product": H100},
        {"free_gpus": 1},
        {"product": H100, "free_gpus": 0},
        {"product": H100, "free_gpus": "many"},
        {"product": H100, "free_gpus": 1, "colour": "red"},
    ],
)
def test_bad_queries_are_a_400(fleet, viewer_client, query):
    assert_error(viewer_client.get(URL, query), 400)


def test_a_product_the_fleet_lacks_is_a_400_naming_those_it_has(fleet, viewer_client):
    body = assert_error(
        viewer_client.get(URL, {"product": "b200", "free_gpus": 1}), 400, "repack.unknown_product"
    )
    assert body["details"]["products"] == [H100]


def test_operators_apply_and_the_operation_reports_the_gpus_freed(
    fleet, operator_client, viewer_client, django_capture_on_commit_callbacks
):
    body = {"product": H100, "free_gpus": 1, "max_unavailable": 1}
    assert_error(viewer_client.post(URL, body, format="json"), 403)
    with django_capture_on_commit_callbacks(execute=True):
        response = operator_client.post(URL, body, format="json")

    assert response.status_code == 202, response.json()
    operation = response.json()
    assert operation["kind"] == "repack"
    assert len(operation["payload"]["plan"]) == 1
    assert_error(operator_client.post(URL, body, format="json"), 409, "repack.in_progress")


def test_applying_an_impossible_or_bad_repack_changes_nothing(fleet, operator_client):
    assert_error(
        operator_client.post(URL, {"product": H100, "free_gpus": 2}, format="json"),
        409,
        "repack.infeasible",
    )
    assert_error(
        operator_client.post(
            URL, {"product": H100, "free_gpus": 1, "max_unavailable": 0}, format="json"
        ),
        400,
    )
    assert not Operation.objects.filter(kind__in=["repack", "move"]).exists()


def test_the_solver_time_limit_is_a_setting(fleet, viewer_client, settings):
    settings.FLEET_REPACK_TIME_LIMIT_SECONDS = 1.5
    body = viewer_client.get(URL, {"product": H100, "free_gpus": 1}).json()
    assert body["time_limit_s"] == 1.5 and body["method"] == "cp-sat"
