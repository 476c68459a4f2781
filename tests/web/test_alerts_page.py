"""The alerts page: admins see the webhooks (their hosts, never a secret) and the latest
deliveries."""

from __future__ import annotations

import pytest
from django.test import Client

from fleet.core import alerts
from tests.factories import webhook

pytestmark = pytest.mark.django_db


def test_admins_see_the_webhooks_and_deliveries_but_never_a_secret(admin_user):
    webhook(
        "https://ops:pw-123@alerts.example.org/in/T00/XXSECRETXX?token=tk-456",
        ["host.back"],
        secret="very-secret-value-123",
    )
    alerts.alert_emit(event=alerts.HOST_BACK, summary="Host h1 is back", subject={})
    client = Client()
    client.force_login(admin_user)
    page = client.get("/alerts/").content.decode()
    assert "https://alerts.example.org/…" in page  # the host, not the path or credentials
    assert "Host h1 is back" in page
    for secret in ("very-secret-value-123", "pw-123", "XXSECRETXX", "tk-456"):
        assert secret not in page
    assert 'href="/alerts/"' in page  # the admin's menu offers it


def test_operators_get_no_alerts_page_and_no_menu_entry(operator_web):
    assert operator_web.get("/alerts/").status_code == 403
    assert 'href="/alerts/"' not in operator_web.get("/operations/").content.decode()


def test_admins_get_a_new_webhook_form_with_every_event_and_format(admin_user):
    client = Client()
    client.force_login(admin_user)
    page = client.get("/alerts/").content.decode()
    assert 'id="webhook-form"' in page
    for event in alerts.EVENTS:
        assert f'name="events" value="{event}"' in page
    assert '<option value="alertmanager">' in page
    assert "POST /api/v1/alerts/webhooks/" in page  # the JSON way stays documented
