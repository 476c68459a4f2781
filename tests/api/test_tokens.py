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


def test_the_token_list_shows_id_prefix_creation_and_expiry(viewer_client):
    created = viewer_client.post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    [listed] = [
        t for t in viewer_client.get("/api/v1/tokens/").json()["results"] if t["name"] == "ci"
    ]
    assert set(listed) == {"id", "name", "prefix", "created_at", "expires_at", "last_used_at"}
    assert listed["id"] == created["id"] and listed["created_at"] == created["created_at"]
    assert created["token"].startswith(f"fla_{listed['prefix']}_") and listed["prefix"]
    assert listed["expires_at"] is None


def test_a_token_can_expire_and_is_refused_afterwards(viewer_client, viewer):
    from datetime import timedelta

    from django.utils import timezone

    response = viewer_client.post(
        "/api/v1/tokens/", {"name": "short", "expires_in_days": 7}, format="json"
    )
    assert response.status_code == 201
    created = response.json()
    row = ApiToken.objects.get(pk=created["id"])
    assert timedelta(days=7) - (row.expires_at - timezone.now()) < timedelta(minutes=1)
    listed = {t["id"]: t for t in viewer_client.get("/api/v1/tokens/").json()["results"]}
    assert listed[created["id"]]["expires_at"] is not None
    script = APIClient()
    script.credentials(HTTP_AUTHORIZATION=f"Token {created['token']}")
    assert script.get("/api/v1/me").status_code == 200
    ApiToken.objects.filter(pk=row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    body = assert_error(script.get("/api/v1/me"), 401, "auth.failed")
    assert "expired" in body["message"]


@pytest.mark.parametrize("days", [0, -1, 3651, "soon", 1.5])
def test_an_expiry_outside_one_day_to_ten_years_is_refused(viewer_client, days):
    before = ApiToken.objects.count()
    response = viewer_client.post(
        "/api/v1/tokens/", {"name": "x", "expires_in_days": days}, format="json"
    )
    assert_error(response, 400, "invalid")
    assert ApiToken.objects.count() == before


def test_a_user_holds_at_most_the_configured_number_of_tokens(viewer_client, viewer, settings):
    settings.FLEET_MAX_API_TOKENS_PER_USER = 3  # the client's own token is the first
    for name in ("two", "three"):
        assert (
            viewer_client.post("/api/v1/tokens/", {"name": name}, format="json").status_code == 201
        )
    body = assert_error(
        viewer_client.post("/api/v1/tokens/", {"name": "four"}, format="json"), 409, "token.limit"
    )
    assert body["details"] == {"limit": 3, "held": 3}
    assert ApiToken.objects.filter(user=viewer).count() == 3
    revoked = ApiToken.objects.filter(user=viewer, name="two").get()
    assert viewer_client.delete(f"/api/v1/tokens/{revoked.pk}/").status_code == 204
    assert viewer_client.post("/api/v1/tokens/", {"name": "four"}, format="json").status_code == 201
