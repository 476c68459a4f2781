"""``POST /hosts/{id}/rotate-token``: admins only; the new token shown once, the old one kept for
a grace or refused at once (``revoke``); every host shows when its token expires."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.agents.enrollment import host_authenticate, host_issue_token
from fleet.agents.host_tokens import ROTATE_GRACE
from fleet.core.models import Operation, OperationKind
from fleet.inventory.models import Host
from fleet.inventory.services import host_create
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


def enrolled(name: str = "gpu-host") -> tuple[Host, str]:
    host, _ = host_create(name=name)
    return host, host_issue_token(host)


def test_an_admin_rotates_a_host_token_and_sees_the_new_one_once(admin_client, admin_user):
    host, old = enrolled()
    response = admin_client.post(f"/api/v1/hosts/{host.pk}/rotate-token")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"] == host.pk and body["token"].startswith("flh_")
    assert parse_datetime(body["token_expires_at"]) > timezone.now()
    grace = parse_datetime(body["previous_token_expires_at"]) - timezone.now()
    assert timedelta(0) < grace <= ROTATE_GRACE
    assert host_authenticate(old) == host  # for the grace
    assert host_authenticate(body["token"]) == host  # which its first use ends
    assert host_authenticate(old) is None
    operation = Operation.objects.get(host=host, kind=OperationKind.ROTATE_HOST_TOKEN)
    assert operation.requested_by == admin_user
    assert body["token"] not in f"{operation.summary} {operation.payload}"
    shown = admin_client.get(f"/api/v1/hosts/{host.pk}/").json()
    assert "token" not in shown and "previous_token_expires_at" not in shown
    assert shown["token_expires_at"] == body["token_expires_at"]


def test_revoke_true_refuses_the_old_token_at_once(admin_client):
    host, old = enrolled()
    response = admin_client.post(f"/api/v1/hosts/{host.pk}/rotate-token?revoke=true")
    assert response.status_code == 200, response.content
    assert response.json()["previous_token_expires_at"] is None
    assert host_authenticate(old) is None
    assert host_authenticate(response.json()["token"]) == host
    operation = Operation.objects.get(host=host, kind=OperationKind.ROTATE_HOST_TOKEN)
    assert operation.payload["reason"] == "revoke"


def test_operators_and_viewers_cannot_rotate_a_host_token(operator_client, viewer_client):
    host, old = enrolled()
    for client in (operator_client, viewer_client):
        assert_error(client.post(f"/api/v1/hosts/{host.pk}/rotate-token"), 403)
    assert host_authenticate(old) == host
    assert not Operation.objects.filter(kind=OperationKind.ROTATE_HOST_TOKEN).exists()


def test_a_rotation_of_an_unknown_host_or_with_a_bad_revoke_is_refused(admin_client):
    host, old = enrolled()
    assert_error(admin_client.post("/api/v1/hosts/999999/rotate-token"), 404)
    assert_error(admin_client.post(f"/api/v1/hosts/{host.pk}/rotate-token?revoke=maybe"), 400)
    assert host_authenticate(old) == host


def test_hosts_show_when_their_token_expires(admin_client):
    host, _ = enrolled()
    listed = admin_client.get("/api/v1/hosts/").json()["results"]
    [row] = [h for h in listed if h["id"] == host.pk]
    expires = Host.objects.get(pk=host.pk).token_expires_at
    assert expires is not None and parse_datetime(row["token_expires_at"]) == expires
