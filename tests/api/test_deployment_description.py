"""A deployment's ``description``: optional free text (at most 500 characters), written on
create and by PATCH, read by every role, shown under its name on its page (escaped)."""

from __future__ import annotations

import pytest
from django.test import Client

from fleet.allocations.models import Deployment
from fleet.core.models import Operation
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

CHAT = {"name": "chat", "kind": "mig", "profile": "1g.10gb"}


def create(client, **body):
    return client.post("/api/v1/deployments/", {**CHAT, **body}, format="json")


def patch(client, deployment_id, body):
    return client.patch(f"/api/v1/deployments/{deployment_id}/", body, format="json")


def test_a_description_given_on_create_is_stored_and_read_back(operator_client, viewer_client):
    response = create(operator_client, description="Support chat for the EU shop.")
    assert response.status_code == 201, response.json()
    assert response.json()["description"] == "Support chat for the EU shop."
    read = viewer_client.get(f"/api/v1/deployments/{response.json()['id']}/").json()
    assert read["description"] == "Support chat for the EU shop."


def test_a_deployment_created_without_one_has_an_empty_description(operator_client):
    response = create(operator_client)
    assert response.status_code == 201, response.json()
    assert response.json()["description"] == ""


def test_patch_changes_the_description_alone_and_records_no_scale(operator_client):
    deployment_id = create(operator_client).json()["id"]
    response = patch(operator_client, deployment_id, {"description": "Now for the US shop."})
    assert response.status_code == 200, response.json()
    assert response.json()["description"] == "Now for the US shop."
    assert Deployment.objects.get(pk=deployment_id).description == "Now for the US shop."
    assert not Operation.objects.filter(deployment_id=deployment_id, kind="scale").exists()


def test_patch_changes_the_description_with_a_scale_in_one_answer(operator_client):
    deployment_id = create(operator_client).json()["id"]
    response = patch(operator_client, deployment_id, {"description": "Two now.", "replicas": 2})
    assert response.status_code == 200, response.json()
    assert (response.json()["description"], response.json()["replicas"]) == ("Two now.", 2)


def test_a_description_past_500_characters_is_refused_and_nothing_is_created(operator_client):
    before = snapshot_rows()
    assert_error(create(operator_client, description="x" * 501), 400)
    assert snapshot_rows() == before


@pytest.mark.parametrize("bad", ["x" * 501, "nul\x00", True, ["a"], {"a": 1}])
def test_a_bad_description_in_a_patch_is_refused_and_changes_nothing(operator_client, bad):
    deployment_id = create(operator_client, description="kept").json()["id"]
    before = snapshot_rows()
    assert_error(patch(operator_client, deployment_id, {"description": bad}), 400)
    assert snapshot_rows() == before


def test_a_bad_scale_beside_a_description_leaves_the_description_as_it_was(operator_client):
    deployment_id = create(operator_client, description="kept").json()["id"]
    response = patch(operator_client, deployment_id, {"description": "lost", "replicas": 0})
    assert response.status_code == 400
    assert Deployment.objects.get(pk=deployment_id).description == "kept"


def test_a_viewer_cannot_change_the_description(operator_client, viewer_client):
    deployment_id = create(operator_client, description="kept").json()["id"]
    assert_error(patch(viewer_client, deployment_id, {"description": "mine"}), 403)
    assert Deployment.objects.get(pk=deployment_id).description == "kept"


def test_the_deployment_page_shows_the_description_escaped(operator_client, viewer):
    text = "<script>alert(1)</script> for the shop"
    deployment_id = create(operator_client, description=text).json()["id"]
    browser = Client()
    browser.force_login(viewer)
    html = browser.get(f"/deployments/{deployment_id}/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt; for the shop" in html
    assert "<script>alert(1)</script>" not in html
