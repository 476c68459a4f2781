"""Priority classes: a small ordered set admins define (critical, production, batch to start),
every role reads; a team's default; a deployment's own ``priority`` (a detail, written on create
and by PATCH, refused when it names no class, with nothing changed)."""

from __future__ import annotations

import pytest

from fleet.allocations.models import Deployment
from fleet.core.models import PriorityClass, Team
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

CHAT = {"name": "chat", "kind": "mig", "profile": "1g.10gb"}


def test_the_default_classes_are_listed_highest_first(viewer_client):
    response = viewer_client.get("/api/v1/priorities/")
    assert response.status_code == 200
    assert [(p["name"], p["value"]) for p in response.json()] == [
        ("critical", 1000),
        ("production", 500),
        ("batch", 100),
    ]


def test_admins_define_change_and_delete_a_class(admin_client, viewer_client):
    made = admin_client.post(
        "/api/v1/priorities/", {"name": "best-effort", "value": 10}, format="json"
    )
    assert made.status_code == 201, made.json()
    changed = admin_client.patch(
        "/api/v1/priorities/best-effort/", {"value": 5, "description": "Idle time."}, format="json"
    )
    assert changed.json() == {"name": "best-effort", "value": 5, "description": "Idle time."}
    assert viewer_client.get("/api/v1/priorities/").json()[-1]["name"] == "best-effort"
    assert admin_client.delete("/api/v1/priorities/best-effort/").status_code == 204
    assert not PriorityClass.objects.filter(name="best-effort").exists()


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"name": "batch", "value": 7}, 409, "priority.taken"),
        ({"name": "other", "value": 500}, 409, "priority.taken"),
        ({"name": "Not A Slug", "value": 7}, 400, "priority.invalid"),
        ({"name": "other", "value": "high"}, 400, "priority.invalid"),
        ({"name": "other"}, 400, "priority.invalid"),
    ],
)
def test_a_bad_class_is_refused_and_changes_nothing(admin_client, body, status, code):
    before = list(PriorityClass.objects.values_list("name", "value"))
    assert_error(admin_client.post("/api/v1/priorities/", body, format="json"), status, code)
    assert list(PriorityClass.objects.values_list("name", "value")) == before


def test_operators_and_viewers_cannot_write_classes(operator_client, viewer_client):
    body = {"name": "mine", "value": 7}
    assert_error(operator_client.post("/api/v1/priorities/", body, format="json"), 403)
    assert_error(viewer_client.delete("/api/v1/priorities/batch/"), 403)
    assert PriorityClass.objects.count() == 3


def test_a_deployment_takes_its_priority_on_create_and_by_patch(operator_client, viewer_client):
    created = operator_client.post(
        "/api/v1/deployments/", {**CHAT, "priority": "batch"}, format="json"
    )
    assert created.status_code == 201, created.json()
    assert created.json()["priority"] == "batch"
    url = f"/api/v1/deployments/{created.json()['id']}/"
    patched = operator_client.patch(url, {"priority": "critical"}, format="json")
    assert patched.status_code == 200, patched.json()
    assert viewer_client.get(url).json()["priority"] == "critical"


def test_a_deployment_naming_no_class_is_refused_and_nothing_is_created(operator_client):
    before = snapshot_rows()
    response = operator_client.post(
        "/api/v1/deployments/", {**CHAT, "priority": "urgent"}, format="json"
    )
    assert_error(response, 400, "priority.unknown")
    assert snapshot_rows() == before and not Deployment.objects.exists()


def test_a_patch_naming_no_class_changes_nothing(operator_client):
    created = operator_client.post(
        "/api/v1/deployments/", {**CHAT, "priority": "batch"}, format="json"
    )
    url = f"/api/v1/deployments/{created.json()['id']}/"
    assert_error(
        operator_client.patch(url, {"priority": "urgent"}, format="json"), 400, "priority.unknown"
    )
    assert Deployment.objects.get().priority == "batch"


def test_a_team_sets_its_default_and_a_class_in_use_cannot_be_deleted(admin_client):
    team = admin_client.post("/api/v1/teams/", {"name": "search"}, format="json").json()
    url = f"/api/v1/teams/{team['id']}/"
    response = admin_client.patch(url, {"default_priority": "production"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["default_priority"] == "production"
    body = assert_error(
        admin_client.delete("/api/v1/priorities/production/"), 409, "priority.in_use"
    )
    assert body["details"]["teams"] == [team["id"]]
    assert_error(
        admin_client.patch(url, {"default_priority": "urgent"}, format="json"),
        400,
        "priority.unknown",
    )
    assert Team.objects.get(pk=team["id"]).default_priority == "production"
