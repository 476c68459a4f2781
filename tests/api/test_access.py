"""Authentication and roles: everything but health needs a login; viewers read, operators act,
admins manage hosts."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleet.core.services import api_token_create
from fleet.inventory.services import host_create
from tests.factories import GpuFactory
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

READ_URLS = [
    "/api/v1/hosts/",
    "/api/v1/gpus/",
    "/api/v1/partitions/",
    "/api/v1/deployments/",
    "/api/v1/allocations/",
    "/api/v1/operations/",
    "/api/v1/mig/catalog/",
    "/api/v1/me",
]


def command_requests(gpu_id: int, deployment_id: int) -> list[tuple[str, str, dict]]:
    return [
        ("put", f"/api/v1/gpus/{gpu_id}/layout", {"mode": "dedicated"}),
        ("post", f"/api/v1/gpus/{gpu_id}/cordon", {}),
        ("post", f"/api/v1/gpus/{gpu_id}/uncordon", {}),
        ("post", "/api/v1/deployments/", {"name": "x", "kind": "gpu", "gpu_count": 1}),
        ("post", f"/api/v1/deployments/{deployment_id}/place", {"gpu": gpu_id}),
        ("post", f"/api/v1/deployments/{deployment_id}/evict", {}),
        ("delete", f"/api/v1/deployments/{deployment_id}/", {}),
    ]


@pytest.fixture
def world(operator_client):
    gpu = GpuFactory(product_key="l4-24gb")
    response = operator_client.post(
        "/api/v1/deployments/", {"name": "d1", "kind": "gpu", "gpu_count": 1}, format="json"
    )
    return gpu.pk, response.json()["id"]


def test_the_openapi_schema_needs_a_login(anon_client, viewer_client):
    assert anon_client.get("/api/schema/").status_code == 401
    assert viewer_client.get("/api/schema/").status_code == 200


def test_the_openapi_schema_needs_a_role(db):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("norole", password="x-y-z-1234")
    _, secret = api_token_create(user=user, name="t")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert client.get("/api/schema/").status_code == 403


@pytest.mark.parametrize("url", READ_URLS)
def test_anonymous_requests_are_refused_with_401(anon_client, url):
    assert_error(anon_client.get(url), 401, "auth.not_authenticated")


def test_the_api_docs_send_anonymous_users_to_the_login_page(anon_client):
    response = anon_client.get("/api/docs/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_health_needs_no_login(anon_client):
    response = anon_client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.parametrize("url", READ_URLS)
def test_viewer_can_read_every_list(viewer_client, url):
    assert viewer_client.get(url).status_code == 200


def test_anonymous_commands_are_refused_and_change_nothing(anon_client, world):
    for method, url, body in command_requests(*world):
        assert_error(getattr(anon_client, method)(url, body, format="json"), 401)


def test_viewer_is_refused_every_operator_action(viewer_client, world):
    for method, url, body in command_requests(*world):
        assert_error(
            getattr(viewer_client, method)(url, body, format="json"), 403, "auth.forbidden"
        )


def test_operator_cannot_create_hosts_but_admin_can(operator_client, admin_client):
    assert_error(operator_client.post("/api/v1/hosts/", {"name": "gpu-01"}, format="json"), 403)
    response = admin_client.post("/api/v1/hosts/", {"name": "gpu-01"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "gpu-01" and body["enrollment_token"].startswith("fle_")


def test_a_wrong_token_is_refused(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token fla_00000000_not-a-real-token")
    assert_error(client.get("/api/v1/gpus/"), 401, "auth.failed")


def test_a_malformed_token_header_is_refused(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token two parts")
    assert_error(client.get("/api/v1/gpus/"), 401, "auth.failed")


def test_a_host_token_is_not_a_user_token(db):
    _, enrollment = host_create(name="h")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {enrollment}")
    assert_error(client.get("/api/v1/gpus/"), 401, "auth.failed")


def test_tokens_of_inactive_users_are_refused(viewer):
    _, secret = api_token_create(user=viewer, name="t")
    viewer.is_active = False
    viewer.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert_error(client.get("/api/v1/gpus/"), 401, "auth.failed")


def test_tokens_are_stored_hashed(viewer):
    token, secret = api_token_create(user=viewer, name="t")
    assert secret not in (token.key_hash, token.prefix)
    assert len(token.key_hash) == 64


def test_me_reports_the_role(viewer_client, operator_client, admin_client):
    assert viewer_client.get("/api/v1/me").json()["role"] == "viewer"
    assert operator_client.get("/api/v1/me").json()["role"] == "operator"
    assert admin_client.get("/api/v1/me").json()["role"] == "admin"


def test_a_user_without_a_role_sees_nothing(make_user, db):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("norole", password="x-y-z-1234")
    _, secret = api_token_create(user=user, name="t")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert_error(client.get("/api/v1/gpus/"), 403)


def test_session_writes_need_the_csrf_token(operator, world):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post(f"/api/v1/gpus/{world[0]}/cordon", {}, format="json")
    assert_error(response, 403, "auth.forbidden")
    assert "CSRF" in response.json()["message"]
