"""Alert webhooks: configured by admins (secret write-only), raised where faults happen,
delivered signed to a real HTTP receiver on loopback, retried with backoff until it answers."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.utils import timezone

from fleet.core import alerts
from fleet.core.models import AlertDelivery, AlertWebhook, Operation, OperationKind
from fleet.core.operations import operation_record
from fleet.core.webhooks import (
    alert_deliver,
    alert_deliveries_due,
    backoff_seconds,
    signature,
    webhook_secret,
)
from fleet.partitioning.delivery import hosts_mark_offline, operations_expire
from fleet.tasks import retry_alerts
from fleet.workflows.health import gpu_mark_unhealthy, gpu_recover
from tests.factories import GpuFactory, HostFactory, webhook
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

SECRET = "a-long-enough-secret-0123456789"


class Receiver:
    """An HTTP server on loopback that checks each body's signature and answers with the next
    status in ``answers`` (the last one repeats)."""

    def __init__(self, answers: list[int]) -> None:
        self.answers = answers
        self.received: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                expected = signature(SECRET, self.headers["X-Fleet-Timestamp"], body)
                receiver.received.append(
                    {
                        "body": json.loads(body),
                        "event": self.headers["X-Fleet-Event"],
                        "signed": hmac.compare_digest(expected, self.headers["X-Fleet-Signature"]),
                    }
                )
                index = min(len(receiver.received), len(receiver.answers)) - 1
                self.send_response(receiver.answers[index])
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def _loopback_receivers(settings: Any) -> None:
    """The receivers here listen on loopback, which webhooks may not reach unless allowed
    (the refusal itself: tests/core/test_webhooks.py)."""
    settings.FLEET_WEBHOOK_ALLOW_PRIVATE = True


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver([500, 200]) as r:
        yield r


def hook(url: str, events: list[str], fmt: str = "fleet") -> AlertWebhook:
    return webhook(url, events, secret=SECRET, format=fmt)


def test_an_unhealthy_gpu_is_delivered_signed_retried_after_a_500_and_then_recovers(
    receiver, django_capture_on_commit_callbacks
):
    hook(receiver.url, [alerts.GPU_UNHEALTHY])
    gpu = GpuFactory()
    with django_capture_on_commit_callbacks(execute=True):
        gpu_mark_unhealthy(gpu_id=gpu.pk, cause="xid", reason="Xid 79 fell off the bus")

    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("retrying", 1, 500)
    assert delivery.last_error == "HTTP 500"
    assert delivery.next_attempt_at is not None
    assert alert_deliveries_due() == []  # not before its backoff

    later = timezone.now() + timedelta(seconds=backoff_seconds(1) + 1)
    assert alert_deliveries_due(later) == [delivery.pk]
    assert alert_deliver(delivery_id=delivery.pk, now=later) == "delivered"

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("delivered", 2, 200)
    assert [r["signed"] for r in receiver.received] == [True, True]
    body = receiver.received[-1]["body"]
    assert body["event"] == "gpu.unhealthy"
    assert body["state"] == "firing"
    assert body["severity"] == "critical"
    assert body["subject"]["gpu"] == {"id": gpu.pk, "uuid": gpu.uuid, "index": gpu.index}
    assert body["subject"]["host"]["name"] == gpu.host.name
    assert alert_deliver(delivery_id=delivery.pk) is None  # delivered once, never again


def test_a_failing_receiver_is_given_up_after_the_bounded_attempts(settings):
    settings.FLEET_ALERT_MAX_ATTEMPTS = 3
    with Receiver([503]) as receiver:
        hook(receiver.url, [alerts.HOST_OFFLINE])
        (pk,) = alerts.alert_emit(event=alerts.HOST_OFFLINE, summary="x", subject={})
        now = timezone.now()
        statuses = []
        for _ in range(4):
            statuses.append(alert_deliver(delivery_id=pk, now=now))
            now += timedelta(hours=2)
    assert statuses == ["retrying", "retrying", "failed", None]
    assert len(receiver.received) == 3
    assert backoff_seconds(1) < backoff_seconds(2) < backoff_seconds(3) <= 3600


def test_a_receiver_that_is_not_listening_is_a_connection_error_retried_later():
    with Receiver([200]) as receiver:
        url = receiver.url
    hook(url, [alerts.HOST_OFFLINE])
    (pk,) = alerts.alert_emit(event=alerts.HOST_OFFLINE, summary="x", subject={})
    assert alert_deliver(delivery_id=pk) == "retrying"
    delivery = AlertDelivery.objects.get()
    assert delivery.response_code is None
    assert "Error" in delivery.last_error


def test_the_retry_beat_sends_the_due_deliveries(receiver, settings):
    settings.FLEET_ALERT_RETRY_SECONDS = 0
    hook(receiver.url, [alerts.HOST_OFFLINE])
    (pk,) = alerts.alert_emit(event=alerts.HOST_OFFLINE, summary="x", subject={})
    assert alert_deliver(delivery_id=pk) == "retrying"
    assert retry_alerts() == 1
    assert AlertDelivery.objects.get().status == "delivered"


def test_events_go_only_to_enabled_webhooks_that_subscribe():
    wants = hook("http://127.0.0.1:9/a", [alerts.GPU_UNHEALTHY, alerts.HOST_BACK])
    hook("http://127.0.0.1:9/b", [alerts.HOST_BACK])
    webhook("http://127.0.0.1:9/c", [alerts.GPU_UNHEALTHY], secret=SECRET, enabled=False)
    alerts.alert_emit(event=alerts.GPU_UNHEALTHY, summary="x", subject={})
    assert list(AlertDelivery.objects.values_list("webhook_id", flat=True)) == [wants.pk]


def test_the_alertmanager_format_fires_and_resolves_the_same_alert(
    receiver, django_capture_on_commit_callbacks
):
    receiver.answers = [200]
    hook(receiver.url, [alerts.GPU_UNHEALTHY, alerts.GPU_RECOVERED], fmt="alertmanager")
    gpu = GpuFactory()
    with django_capture_on_commit_callbacks(execute=True):
        gpu_mark_unhealthy(gpu_id=gpu.pk, cause="xid", reason="Xid 79")
    with django_capture_on_commit_callbacks(execute=True):
        gpu_recover(gpu_id=gpu.pk, reason="quiet")
    (firing,), (resolved,) = (r["body"] for r in receiver.received)
    assert firing["labels"] == resolved["labels"]
    assert firing["labels"]["alertname"] == "FleetGpuUnhealthy"
    assert firing["labels"]["gpu"] == gpu.uuid
    assert firing["labels"]["host"] == gpu.host.name
    assert "endsAt" not in firing
    assert resolved["endsAt"] == resolved["startsAt"]
    assert all(r["signed"] for r in receiver.received)


def test_hosts_going_offline_and_operations_failing_or_expiring_raise_alerts(settings):
    hook(
        "http://127.0.0.1:9/",
        [alerts.HOST_OFFLINE, alerts.OPERATION_FAILED, alerts.OPERATION_EXPIRED],
    )
    host = HostFactory(token_hash="x", last_seen_at=timezone.now() - timedelta(hours=1))
    hosts_mark_offline()
    operation_record(kind=OperationKind.PLACE, summary="place", host=host, status="failed")
    stuck = operation_record(kind=OperationKind.SET_LAYOUT, summary="layout", host=host)
    stuck.generation = 1
    stuck.save()
    settings.FLEET_OPERATION_TIMEOUT_SECONDS = 0
    operations_expire(timezone.now() + timedelta(seconds=1))
    events = list(AlertDelivery.objects.order_by("id").values_list("event", flat=True))
    assert events == ["host.offline", "operation.failed", "operation.expired"]
    expired = AlertDelivery.objects.get(event="operation.expired").payload
    assert expired["subject"]["operation"]["id"] == stuck.pk


def test_quota_events_are_defined_for_webhooks_to_subscribe(admin_client):
    response = admin_client.post(
        "/api/v1/alerts/webhooks/",
        {
            "url": "https://example.org/h",
            "events": ["quota.warning", "quota.exceeded"],
            "secret": SECRET,
        },
        format="json",
    )
    assert response.status_code == 201, response.content


# ---- the API ---------------------------------------------------------------------------------


def test_admins_create_list_change_and_delete_webhooks_and_never_see_the_secret(admin_client):
    created = admin_client.post(
        "/api/v1/alerts/webhooks/",
        {
            "url": "https://alerts.example.org/in",
            "events": ["gpu.unhealthy"],
            "secret": SECRET,
            "format": "alertmanager",
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    assert "secret" not in created.json()
    pk = created.json()["id"]
    listed = admin_client.get("/api/v1/alerts/webhooks/").json()["results"]
    assert [w["id"] for w in listed] == [pk]
    assert "secret" not in listed[0]
    changed = admin_client.patch(
        f"/api/v1/alerts/webhooks/{pk}/",
        {"events": ["host.offline", "host.back"], "secret": "another-secret-0123456789"},
        format="json",
    )
    assert changed.status_code == 200, changed.content
    assert changed.json()["events"] == ["host.offline", "host.back"]
    assert webhook_secret(AlertWebhook.objects.get()) == "another-secret-0123456789"
    assert admin_client.delete(f"/api/v1/alerts/webhooks/{pk}/").status_code == 204
    assert not AlertWebhook.objects.exists()
    kinds = Operation.objects.filter(kind="set_webhook").values_list("summary", flat=True)
    assert len(kinds) == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("url", "ftp://example.org/x"),
        ("url", "file:///etc/passwd"),
        ("url", "https://"),
        ("url", "https://example.org/" + "x" * 2000),
        ("events", []),
        ("events", ["gpu.exploded"]),
        ("events", ["gpu.unhealthy", "gpu.unhealthy"]),
        ("secret", "short"),
        ("secret", "x" * 257),
        ("format", "slack"),
    ],
)
def test_invalid_webhooks_are_refused_with_the_field_named(admin_client, field, value):
    body = {"url": "https://example.org/h", "events": ["gpu.unhealthy"], "secret": SECRET}
    body[field] = value
    response = admin_client.post("/api/v1/alerts/webhooks/", body, format="json")
    assert_error(response, 400)
    assert not AlertWebhook.objects.exists()


def test_only_admins_see_webhooks_and_deliveries(operator_client, viewer_client):
    for client in (operator_client, viewer_client):
        assert client.get("/api/v1/alerts/webhooks/").status_code == 403
        assert client.get("/api/v1/alerts/deliveries/").status_code == 403
        body = {"url": "https://example.org/h", "events": ["gpu.unhealthy"], "secret": SECRET}
        assert client.post("/api/v1/alerts/webhooks/", body, format="json").status_code == 403


def test_admins_read_the_delivery_log(admin_client):
    hook("http://127.0.0.1:9/", [alerts.HOST_BACK])
    alerts.alert_emit(event=alerts.HOST_BACK, summary="back", subject={"host": {"id": 1}})
    rows = admin_client.get("/api/v1/alerts/deliveries/?status=pending").json()["results"]
    assert [(r["event"], r["status"], r["attempts"]) for r in rows] == [("host.back", "pending", 0)]
    assert "secret" not in json.dumps(rows)


def test_signature_is_hmac_sha256_of_timestamp_and_body():
    body = b'{"a":1}'
    expected = hmac.new(SECRET.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert signature(SECRET, "1700000000", body) == f"sha256={expected}"


def test_a_host_back_and_a_replica_entering_a_crash_loop_raise_alerts():
    from fleet.agents.last_seen import hosts_seen
    from fleet.allocations.models import Allocation
    from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
    from fleet.allocations.workloads import workloads_record
    from fleet.mps import MpsPolicy
    from fleet.partitioning.services import LayoutSpec, gpu_set_layout

    hook("http://127.0.0.1:9/", [alerts.HOST_BACK, alerts.REPLICA_CRASHLOOP])
    gpu = GpuFactory(host=HostFactory(runtime="docker"))
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    deployment = deployment_create(
        name="asr",
        request=DeploymentRequest(kind="mps", memory_mib=1024),
        replicas=1,
        workload={"runtime": "container", "image": "registry.example/asr:1"},
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)
    type(gpu.host).objects.filter(pk=gpu.host_id).update(status="offline")
    hosts_seen([gpu.host_id])
    allocation = Allocation.objects.get()
    status = {
        "allocation_id": allocation.pk,
        "state": "crashloop",
        "started_at": None,
        "exit_code": 1,
        "restarts": 5,
        "message": "exit 1",
        "pids": [],
    }
    for _ in range(2):  # the same state reported again raises nothing new
        workloads_record(host_id=gpu.host_id, statuses=[status], full=False)
    rows = AlertDelivery.objects.order_by("id")
    assert [r.event for r in rows] == ["host.back", "replica.crashloop"]
    back, crash = (r.payload for r in rows)
    assert back["state"] == "resolved"
    assert back["subject"]["host"]["name"] == gpu.host.name
    assert crash["subject"]["deployment"] == {"id": deployment.pk, "name": "asr"}
    assert crash["subject"]["replica"] == 0
    assert "asr[0]" in crash["summary"]


def test_a_receiver_answering_garbage_is_a_failed_attempt_not_a_crash():
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b"this is not http\r\n\r\n")
        conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    hook(f"http://127.0.0.1:{server.getsockname()[1]}/", [alerts.HOST_BACK])
    (pk,) = alerts.alert_emit(event=alerts.HOST_BACK, summary="x", subject={})
    try:
        assert alert_deliver(delivery_id=pk) == "retrying"
    finally:
        thread.join(5)
        server.close()
    assert AlertDelivery.objects.get().last_error.startswith("BadStatusLine")
