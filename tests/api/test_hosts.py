"""Hosts in the API: operators cordon, uncordon, drain (now or at a time) and edit labels;
viewers are refused; bad input is a 400 that changes nothing; deployments may require labels."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.allocations.models import Deployment
from fleet.core.models import Operation
from fleet.inventory.models import Host, HostStatus
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def host():
    return HostFactory(name="gpu-a", runtime="process", labels={"zone": "a"})


def _url(host, command: str = "") -> str:
    return f"/api/v1/hosts/{host.pk}/{command}"


@pytest.mark.parametrize("command", ["cordon", "uncordon", "drain"])
def test_a_viewer_cannot_cordon_uncordon_or_drain_a_host(viewer_client, host, command):
    before = snapshot_rows()
    response = viewer_client.post(_url(host, command), {}, format="json")
    assert_error(response, 403)
    assert snapshot_rows() == before


def test_a_viewer_cannot_edit_labels(viewer_client, host):
    response = viewer_client.patch(_url(host), {"labels": {"zone": "b"}}, format="json")
    assert_error(response, 403)
    assert Host.objects.get(pk=host.pk).labels == {"zone": "a"}


def test_an_operator_cordons_and_uncordons_a_host(operator_client, host):
    cordoned = operator_client.post(_url(host, "cordon"))
    assert cordoned.status_code == 200, cordoned.json()
    assert cordoned.json()["status"] == "cordoned"
    again = operator_client.post(_url(host, "cordon"))
    assert again.status_code == 200
    back = operator_client.post(_url(host, "uncordon"))
    assert back.status_code == 200 and back.json()["status"] == "ready"
    assert_error(operator_client.post(_url(host, "uncordon")), 409, "host.not_cordoned")
    kinds = list(Operation.objects.filter(host=host).values_list("kind", flat=True))
    assert kinds.count("cordon_host") == 2 and kinds.count("uncordon_host") == 1


def test_an_offline_host_cannot_be_cordoned(operator_client, host):
    Host.objects.filter(pk=host.pk).update(status=HostStatus.OFFLINE)
    body = assert_error(operator_client.post(_url(host, "cordon")), 409, "host.not_ready")
    assert "offline" in body["message"]


def test_an_empty_host_drains_straight_to_maintenance(
    operator_client, host, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = operator_client.post(_url(host, "drain"), {}, format="json")
    assert response.status_code == 202, response.json()
    operation = response.json()
    assert operation["kind"] == "drain_host"
    assert Operation.objects.get(pk=operation["id"]).status == "succeeded"
    assert Host.objects.get(pk=host.pk).status == HostStatus.MAINTENANCE
    assert operator_client.get(_url(host)).json()["status"] == "maintenance"


def test_a_scheduled_drain_is_listed_on_the_host_and_cancelled_by_uncordon(operator_client, host):
    at = (timezone.now() + timedelta(days=1)).replace(microsecond=0)
    response = operator_client.post(_url(host, "drain"), {"at": at.isoformat()}, format="json")
    assert response.status_code == 202, response.json()
    operation = response.json()
    assert operation["status"] == "pending" and operation["payload"]["step"] == "scheduled"
    drain = operator_client.get(_url(host)).json()["drain"]
    assert drain["operation"] == operation["id"] and drain["step"] == "scheduled"
    assert drain["at"].startswith(at.strftime("%Y-%m-%dT%H:%M"))
    feed = operator_client.get("/api/v1/operations/?kind=drain_host").json()
    assert [o["id"] for o in feed["results"]] == [operation["id"]]
    assert_error(
        operator_client.post(_url(host, "drain"), {}, format="json"),
        409,
        "host.drain_in_progress",
    )
    assert operator_client.post(_url(host, "uncordon")).status_code == 200
    assert operator_client.get(_url(host)).json()["drain"] is None
    assert Operation.objects.get(pk=operation["id"]).status == "failed"


@pytest.mark.parametrize(
    "body",
    [
        {"at": "yesterday"},
        {"at": "2020-01-01T00:00:00Z"},
        {"at": "2999-01-01T00:00:00Z"},
        {"force": "perhaps"},
        {"timeout_s": 1},
    ],
)
def test_a_bad_drain_request_is_a_400_that_changes_nothing(operator_client, host, body):
    before = snapshot_rows()
    response = operator_client.post(_url(host, "drain"), body, format="json")
    assert_error(response, 400)
    assert snapshot_rows() == before


def test_an_operator_replaces_a_hosts_labels(operator_client, host):
    response = operator_client.patch(
        _url(host), {"labels": {"zone": "b", "example.com/rack": "r7"}}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json()["labels"] == {"zone": "b", "example.com/rack": "r7"}
    assert Host.objects.get(pk=host.pk).labels == {"zone": "b", "example.com/rack": "r7"}
    assert Operation.objects.filter(host=host, kind="set_labels").count() == 1


@pytest.mark.parametrize(
    "body",
    [
        {"labels": {f"k{i}": "v" for i in range(33)}},
        {"labels": {"k" * 64: "v"}},
        {"labels": {"zone": "v" * 64}},
        {"labels": {"-zone": "a"}},
        {"labels": {"zone a": "a"}},
        {"labels": {"zone": 3}},
        {"labels": {"zone": "a\nb"}},
        {"labels": ["zone"]},
        {"labels": {"zone": "a"}, "name": "other"},
        {"name": "other"},
    ],
    ids=[
        "33 labels",
        "key too long",
        "value too long",
        "key starts with a dash",
        "key with a space",
        "value not a string",
        "value with a newline",
        "not a map",
        "another field",
        "no labels",
    ],
)
def test_bad_labels_are_a_400_that_changes_nothing(operator_client, host, body):
    before = snapshot_rows()
    response = operator_client.patch(_url(host), body, format="json")
    assert_error(response, 400)
    assert snapshot_rows() == before
    assert Host.objects.get(pk=host.pk).labels == {"zone": "a"}


def test_32_labels_of_63_characters_are_accepted(operator_client, host):
    labels = {f"k{i:02d}" + "x" * 60: "v" * 63 for i in range(32)}
    response = operator_client.patch(_url(host), {"labels": labels}, format="json")
    assert response.status_code == 200, response.json()
    assert Host.objects.get(pk=host.pk).labels == labels


def test_a_deployment_requiring_a_label_is_placed_only_where_it_is(operator_client, host):
    other = HostFactory(name="gpu-b", runtime="process", labels={"zone": "b"})
    for owner in (host, other):
        gpu = GpuFactory(host=owner, product_key="h100-sxm5-80gb")
        gpu_set_layout(
            gpu_id=gpu.pk,
            spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec(profile="3g.40gb", start=4),)),
        )
    response = operator_client.post(
        "/api/v1/deployments/",
        {"name": "llm", "kind": "mig", "profile": "3g.40gb", "host_labels": {"zone": "b"}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    deployment = response.json()
    assert deployment["host_labels"] == {"zone": "b"}
    targets = operator_client.get(f"/api/v1/deployments/{deployment['id']}/targets").json()
    gpu_b = other.gpus.get().pk
    assert {t["gpu"] for t in targets["feasible"]} == {gpu_b}
    refused = [v for r in targets["infeasible"] for v in r["violations"]]
    assert {v["code"] for v in refused} == {"placement.host_labels"}
    assert "zone=b" in refused[0]["message"]
    gpu_a = host.gpus.get()
    place = operator_client.post(
        f"/api/v1/deployments/{deployment['id']}/place", {"gpu": gpu_a.pk}, format="json"
    )
    assert_error(place, 422, "placement.host_labels")
    patch = operator_client.patch(
        f"/api/v1/deployments/{deployment['id']}/", {"host_labels": {}}, format="json"
    )
    assert_error(patch, 400, "deployment.field_immutable")


def test_a_deployment_with_bad_host_labels_is_a_400_that_creates_nothing(operator_client):
    response = operator_client.post(
        "/api/v1/deployments/",
        {"name": "llm", "kind": "mig", "profile": "3g.40gb", "host_labels": {"-x": "a"}},
        format="json",
    )
    assert_error(response, 400)
    assert not Deployment.objects.exists()
