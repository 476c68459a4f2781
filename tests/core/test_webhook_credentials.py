"""Webhook credentials at rest and in answers: the URL (user name, password, path, query) and
the signing secret are encrypted like team secrets, sent as they were given, and never shown:
the API, the page and the audit trail see ``scheme://host[:port]/…`` only."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from fleet.core import alerts
from fleet.core.models import AlertDelivery, AlertWebhook, Operation
from fleet.core.redaction import url_shown
from fleet.core.secrets import secret_decrypt, secrets_reencrypt
from fleet.core.webhooks import alert_deliver, signature, webhook_secret, webhook_url
from fleet.settings.secret_key import new_fernet_key
from tests.core.test_alerts import SECRET

pytestmark = pytest.mark.django_db

SLACK = "https://ops:hunter2@hooks.slack.com/services/T0000/B0000/XXXXSECRETXXXX?token=tk-123"
LEAKS = ("hunter2", "XXXXSECRETXXXX", "tk-123", "T0000", SECRET)


def raw_row(pk: int) -> str:
    """The row as the database holds it, every column as text."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM core_alertwebhook WHERE id = %s", [pk])
        return " ".join(str(value) for value in cursor.fetchone())


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://alerts.example.org", "https://alerts.example.org"),
        ("https://alerts.example.org/", "https://alerts.example.org"),
        ("https://alerts.example.org:8443/in", "https://alerts.example.org:8443/…"),
        ("http://u:p@10.0.0.1:9093/", "http://10.0.0.1:9093/…"),
        ("https://example.org?token=x", "https://example.org/…"),
        (SLACK, "https://hooks.slack.com/…"),
    ],
)
def test_only_the_scheme_host_and_port_of_a_webhook_url_are_shown(url, shown):
    assert url_shown(url) == shown


def test_the_url_and_the_secret_are_encrypted_at_rest_and_never_answered(admin_client):
    body = {"url": SLACK, "events": ["gpu.unhealthy"], "secret": SECRET}
    created = admin_client.post("/api/v1/alerts/webhooks/", body, format="json")
    assert created.status_code == 201, created.content
    pk = created.json()["id"]
    assert created.json()["url"] == "https://hooks.slack.com/…"
    answers = [
        created.content,
        admin_client.get("/api/v1/alerts/webhooks/").content,
        admin_client.get(f"/api/v1/alerts/webhooks/{pk}/").content,
        admin_client.patch(
            f"/api/v1/alerts/webhooks/{pk}/", {"enabled": False}, format="json"
        ).content,
        admin_client.get("/api/v1/operations/?kind=set_webhook").content,
        admin_client.get("/alerts/").content,
    ]
    summaries = " ".join(Operation.objects.values_list("summary", flat=True))
    for leak in LEAKS:
        assert all(leak.encode() not in answer for answer in answers), leak
        assert leak not in summaries and leak not in raw_row(pk), leak
    webhook = AlertWebhook.objects.get(pk=pk)
    assert (webhook_url(webhook), webhook_secret(webhook)) == (SLACK, SECRET)


def test_a_new_url_or_secret_replaces_the_encrypted_one(admin_client):
    body = {"url": "https://alerts.example.org/a", "events": ["gpu.unhealthy"], "secret": SECRET}
    pk = admin_client.post("/api/v1/alerts/webhooks/", body, format="json").json()["id"]
    changed = admin_client.patch(
        f"/api/v1/alerts/webhooks/{pk}/",
        {"url": "https://other.example.org/b?k=v", "secret": "another-secret-0123456789"},
        format="json",
    )
    assert changed.status_code == 200 and changed.json()["url"] == "https://other.example.org/…"
    webhook = AlertWebhook.objects.get(pk=pk)
    assert webhook_url(webhook) == "https://other.example.org/b?k=v"
    assert webhook_secret(webhook) == "another-secret-0123456789"


@pytest.fixture
def basic_receiver(settings: Any) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A loopback receiver that records each request's path, credentials and signature."""
    settings.FLEET_WEBHOOK_ALLOW_PRIVATE = True
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            auth = self.headers.get("Authorization", "")
            seen.append(
                {
                    "path": self.path,
                    "auth": base64.b64decode(auth.removeprefix("Basic ")).decode(),
                    "signed": signature(SECRET, self.headers["X-Fleet-Timestamp"], body)
                    == self.headers["X-Fleet-Signature"],
                }
            )
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_the_whole_url_is_sent_its_user_and_password_as_http_basic(admin_client, basic_receiver):
    where, seen = basic_receiver
    url = f"http://ops:p%40ss@{where}/services/T0/B0/XSECRETX?token=tk"
    body = {"url": url, "events": [alerts.HOST_OFFLINE], "secret": SECRET}
    assert admin_client.post("/api/v1/alerts/webhooks/", body, format="json").status_code == 201
    (pk,) = alerts.alert_emit(event=alerts.HOST_OFFLINE, summary="x", subject={})
    assert alert_deliver(delivery_id=pk) == "delivered"
    assert seen == [
        {"path": "/services/T0/B0/XSECRETX?token=tk", "auth": "ops:p@ss", "signed": True}
    ]


def test_rotating_the_key_re_encrypts_the_webhooks_too(settings, admin_client):
    old, new = new_fernet_key(), new_fernet_key()
    settings.FLEET_SECRETS_KEYS = [old]
    body = {"url": SLACK, "events": ["gpu.unhealthy"], "secret": SECRET}
    pk = admin_client.post("/api/v1/alerts/webhooks/", body, format="json").json()["id"]
    settings.FLEET_SECRETS_KEYS = [new, old]
    assert secrets_reencrypt() == (1, 0)
    settings.FLEET_SECRETS_KEYS = [new]
    webhook = AlertWebhook.objects.get(pk=pk)
    assert (webhook_url(webhook), webhook_secret(webhook)) == (SLACK, SECRET)


def test_without_the_key_a_delivery_fails_and_says_why_without_a_leak(settings, admin_client):
    settings.FLEET_SECRETS_KEYS = [new_fernet_key()]
    body = {"url": SLACK, "events": [alerts.HOST_OFFLINE], "secret": SECRET}
    assert admin_client.post("/api/v1/alerts/webhooks/", body, format="json").status_code == 201
    settings.FLEET_SECRETS_KEYS = [new_fernet_key()]  # the key that encrypted them is gone
    (pk,) = alerts.alert_emit(event=alerts.HOST_OFFLINE, summary="x", subject={})
    assert alert_deliver(delivery_id=pk) == "retrying"
    delivery = AlertDelivery.objects.get(pk=pk)
    assert "FLEET_SECRETS_KEYS" in delivery.last_error and delivery.response_code is None


BEFORE = [("core", "0016_operation_requested_by_name")]
AFTER = [("core", "0017_webhook_credentials_encrypted")]


@pytest.mark.django_db(transaction=True)
def test_the_migration_encrypts_existing_webhooks_and_can_be_undone():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps.get_model("core", "AlertWebhook")
    pk = old.objects.create(url=SLACK, events=["gpu.unhealthy"], secret=SECRET).pk
    try:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(AFTER)
        new = executor.loader.project_state(AFTER).apps.get_model("core", "AlertWebhook")
        row = new.objects.get(pk=pk)
        assert row.url == "https://hooks.slack.com/…"
        assert secret_decrypt(row.url_ciphertext) == SLACK
        assert secret_decrypt(row.secret_ciphertext) == SECRET
        assert not any(leak in raw_row(pk) for leak in LEAKS)

        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(BEFORE)
        back = executor.loader.project_state(BEFORE).apps.get_model("core", "AlertWebhook")
        assert (back.objects.get(pk=pk).url, back.objects.get(pk=pk).secret) == (SLACK, SECRET)
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
