"""Host tokens expire and are renewed: an expired token is refused like an unknown one, a renewal
keeps the old token accepted until the new one is used (or a day at most), and an agent back with
the old one is renewed again. Admins rotate a token with a grace, or revoke it at once."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from fleet.agents.enrollment import host_authenticate, host_issue_token, hosts_authenticate
from fleet.agents.host_tokens import (
    RENEW_GRACE,
    ROTATE_GRACE,
    host_renewal_due,
    host_token_renew,
    host_token_rotate,
)
from fleet.core.models import Operation, OperationKind
from fleet.core.tokens import hash_token, token_prefix
from fleet.inventory.models import Host
from fleet.inventory.services import host_create, host_revoke_token
from tests.agent_sim import SimAgent
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


def enrolled(name: str = "gpu-host") -> tuple[Host, str]:
    host, _ = host_create(name=name)
    token = host_issue_token(host)
    host.refresh_from_db()
    return host, token


def expiring_in(host: Host, delta: timedelta) -> None:
    Host.objects.filter(pk=host.pk).update(token_expires_at=timezone.now() + delta)


def agent_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


# -- expiry ---------------------------------------------------------------------------------


def test_an_issued_host_token_expires_after_the_configured_days(settings):
    settings.FLEET_HOST_TOKEN_DAYS = 2.0
    host, _ = enrolled()
    assert host.token_expires_at is not None
    left = host.token_expires_at - timezone.now()
    assert timedelta(days=2) - timedelta(minutes=1) < left <= timedelta(days=2)


def test_an_expired_token_is_refused_like_an_unknown_one_and_the_log_says_it_expired(caplog):
    host, token = enrolled()
    assert host_authenticate(token) == host
    expiring_in(host, timedelta(seconds=-1))
    with caplog.at_level(logging.WARNING, logger="fleet.agents.enrollment"):
        assert host_authenticate(token) is None
    assert f"host {host.pk}: refused its current agent token: expired" in caplog.text
    assert token not in caplog.text and token_prefix(token) not in caplog.text
    # The batched lookup still names the holder, with the expiry that the caller checks.
    holder = hosts_authenticate([token])[token]
    assert holder.host_id == host.pk and holder.expired(timezone.now().timestamp())


def test_the_rest_api_refuses_an_expired_token_with_the_same_401_as_a_forged_one():
    host, token = enrolled()
    expiring_in(host, timedelta(seconds=-1))
    expired = assert_error(agent_client(token).get("/api/v1/agent/desired-state"), 401)
    forged = assert_error(
        agent_client("flh_00000000_forged").get("/api/v1/agent/desired-state"), 401
    )
    assert expired == forged


# -- renewal --------------------------------------------------------------------------------


def test_a_token_far_from_its_expiry_is_not_renewed():
    host, token = enrolled()
    assert not host_renewal_due(host, token)
    assert host_token_renew(host_id=host.pk, token=token) is None
    assert Host.objects.get(pk=host.pk).token_hash == hash_token(token)


def test_a_renewal_keeps_the_old_token_until_the_new_one_is_used():
    host, old = enrolled()
    expiring_in(host, timedelta(days=3))  # inside the 7-day window
    message = host_token_renew(host_id=host.pk, token=old)
    assert message is not None and message["type"] == "host_token"
    new = message["token"]
    assert token_prefix(new) == token_prefix(old) and new != old
    host.refresh_from_db()
    assert host.token_hash == hash_token(new) and host.previous_token_hash == hash_token(old)
    assert host.token_expires_at is not None
    assert abs(host.token_expires_at.timestamp() - message["expires_at"]) < 1e-3
    assert host.token_expires_at - timezone.now() > timedelta(days=29)
    assert host.previous_token_expires_at is not None
    assert host.previous_token_expires_at - timezone.now() <= RENEW_GRACE
    assert host_authenticate(old) == host  # the renewal may have been lost on the way
    assert Host.objects.get(pk=host.pk).previous_token_hash == hash_token(old)
    assert host_authenticate(new) == host  # the agent uses the new one: the old one goes
    host.refresh_from_db()
    assert (host.previous_token_hash, host.previous_token_expires_at) == ("", None)
    assert host_authenticate(old) is None


def test_a_renewal_never_lets_the_old_token_live_past_its_own_expiry():
    host, old = enrolled()
    expiring_in(host, timedelta(hours=2))
    before = Host.objects.get(pk=host.pk).token_expires_at
    assert host_token_renew(host_id=host.pk, token=old) is not None
    assert Host.objects.get(pk=host.pk).previous_token_expires_at == before


def test_the_old_token_is_refused_once_its_grace_is_over_even_if_the_new_one_was_never_used():
    host, old = enrolled()
    expiring_in(host, timedelta(days=1))
    assert host_token_renew(host_id=host.pk, token=old) is not None
    Host.objects.filter(pk=host.pk).update(
        previous_token_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert host_authenticate(old) is None
    assert host_token_renew(host_id=host.pk, token=old) is None  # nor renewed from


def test_a_token_from_before_tokens_expired_is_renewed_at_its_first_use():
    host, old = enrolled()
    Host.objects.filter(pk=host.pk).update(token_expires_at=None)
    host.refresh_from_db()
    assert host_authenticate(old) == host  # still accepted: it expires at its renewal
    assert host_renewal_due(host, old)
    assert host_token_renew(host_id=host.pk, token=old) is not None
    host.refresh_from_db()
    assert host.previous_token_expires_at is not None
    assert host.previous_token_expires_at - timezone.now() <= RENEW_GRACE


def test_an_agent_back_with_the_old_token_is_renewed_again_and_keeps_its_fallback():
    host, old = enrolled()
    expiring_in(host, timedelta(days=1))
    lost = host_token_renew(host_id=host.pk, token=old)
    assert lost is not None
    grace = Host.objects.get(pk=host.pk).previous_token_expires_at
    host.refresh_from_db()
    assert host_renewal_due(host, old)  # it never got the current one
    again = host_token_renew(host_id=host.pk, token=old)
    assert again is not None and again["token"] != lost["token"]
    host.refresh_from_db()
    assert host.token_hash == hash_token(again["token"])
    assert (host.previous_token_hash, host.previous_token_expires_at) == (hash_token(old), grace)
    assert host_authenticate(lost["token"]) is None  # nobody ever held it


def test_a_renewal_is_an_operation_that_does_not_hold_the_token():
    host, old = enrolled()
    expiring_in(host, timedelta(days=1))
    message = host_token_renew(host_id=host.pk, token=old)
    assert message is not None
    [operation] = Operation.objects.filter(host=host, kind=OperationKind.ROTATE_HOST_TOKEN)
    assert operation.status == "succeeded" and operation.payload["reason"] == "renewal"
    recorded = f"{operation.summary} {operation.payload}"
    for secret in (old, message["token"]):
        assert secret not in recorded and secret.split("_", 2)[2] not in recorded


def test_revoking_a_host_token_refuses_the_one_a_renewal_replaced_too():
    host, old = enrolled()
    expiring_in(host, timedelta(days=1))
    new = host_token_renew(host_id=host.pk, token=old)
    assert new is not None
    host_revoke_token(host_id=host.pk)
    assert host_authenticate(old) is None and host_authenticate(new["token"]) is None


def test_a_rest_agent_near_expiry_gets_its_new_token_in_the_report_answer():
    host, old = enrolled()
    expiring_in(host, timedelta(days=2))
    agent = SimAgent(["a30-24gb"])
    response = agent_client(old).post(
        "/api/v1/agent/report", {"messages": [agent.hello()]}, format="json"
    )
    assert response.status_code == 200, response.content
    renewed = response.json()["host_token"]
    assert renewed["type"] == "host_token"
    again = agent_client(renewed["token"]).post(
        "/api/v1/agent/report", {"messages": [agent.telemetry()]}, format="json"
    )
    assert again.status_code == 200 and "host_token" not in again.json()
    assert_error(agent_client(old).get("/api/v1/agent/desired-state"), 401)


# -- an admin's rotation --------------------------------------------------------------------


def test_a_rotation_accepts_the_old_token_for_a_grace():
    host, old = enrolled()
    _, new = host_token_rotate(host_id=host.pk)
    host.refresh_from_db()
    assert host.token_hash == hash_token(new) and host.previous_token_hash == hash_token(old)
    assert host.previous_token_expires_at is not None
    assert host.previous_token_expires_at - timezone.now() <= ROTATE_GRACE
    assert host_authenticate(old) == host
    operation = Operation.objects.get(host=host, kind=OperationKind.ROTATE_HOST_TOKEN)
    assert operation.payload["reason"] == "rotation" and new not in str(operation.payload)


def test_a_rotation_with_revoke_refuses_the_old_token_at_once():
    host, old = enrolled()
    _, new = host_token_rotate(host_id=host.pk, revoke=True)
    assert host_authenticate(old) is None
    assert host_authenticate(new) == host
