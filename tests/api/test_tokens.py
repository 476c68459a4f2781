"""Users manage their own API tokens: shown once, stored hashed, revocable, never another's."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleet.core.models import ApiToken
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


def test_a_viewer_creates_lists_uses_and_revokes_a_token(viewer_client, viewer):
    response = viewer_client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert response.status_code == 201
    created = response.json()
    secret = created["token"]
    assert (
        secret.startswith("fla_") and secret not in ApiToken.objects.get(pk=created["id"]).key_hash
    )
    listed = viewer_client.get("/api/v1/tokens/").json()["results"]
    assert {t["name"] for t in listed} == {"test", "ci"} and all("token" not in t for t in listed)
    script = APIClient()
    script.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert script.get("/api/v1/me").json()["username"] == viewer.username
    assert viewer_client.delete(f"/api/v1/tokens/{created['id']}/").status_code == 204
    assert_error(script.get("/api/v1/me"), 401)


def test_nobody_sees_or_revokes_anothers_token(viewer_client, operator_client):
    mine = operator_client.post("/api/v1/tokens/", {"name": "ops"}, format="json").json()
    assert all(
        t["id"] != mine["id"] for t in viewer_client.get("/api/v1/tokens/").json()["results"]
    )
    assert_error(viewer_client.delete(f"/api/v1/tokens/{mine['id']}/"), 404)
    assert_error(viewer_client.get(f"/api/v1/tokens/{mine['id']}/"), 404)
    assert ApiToken.objects.filter(pk=mine["id"]).exists()


def test_token_requests_are_validated_and_need_a_login(viewer_client, anon_client):
    assert_error(viewer_client.post("/api/v1/tokens/", {}, format="json"), 400, "invalid")
    assert_error(anon_client.post("/api/v1/tokens/", {"name": "x"}, format="json"), 401)
