"""Webhook sending limits (fleet.core.webhooks): one deadline for the whole send, and no
loopback, link-local (cloud metadata), unspecified or multicast destination, refused when the
URL is given and again after DNS resolution, connecting to the address that was checked."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fleet.core import alerts
from fleet.core.alerts import EVENTS, RESOLVES, SEVERITY
from fleet.core.models import AlertDelivery, AlertWebhook
from fleet.core.webhooks import alert_deliver, webhook_url
from tests.core.test_alerts import SECRET, Receiver, hook
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


def deliver_once(url: str) -> AlertDelivery:
    hook(url, [alerts.HOST_OFFLINE])
    (pk,) = alerts.alert_emit(event=alerts.HOST_OFFLINE, summary="x", subject={})
    alert_deliver(delivery_id=pk)
    return AlertDelivery.objects.get(pk=pk)


# ---- one deadline for the whole send ---------------------------------------------------------


@pytest.fixture
def trickler(request) -> Iterator[int]:
    """A receiver on loopback (its port) that answers one byte every 0.2 s (a 5 s answer, then
    it hangs up): each read is quick, the whole answer is not. The answer is the indirect
    parameter."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    done = threading.Event()

    def answer() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)
            for byte in request.param[:25]:
                if done.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.2)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    done.set()
    server.close()
    thread.join(5)


HTTP_ANSWER = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 40
TLS_HANDSHAKE = bytes([0x16, 3, 3, 0x40, 0]) + b"a" * 40  # a 16 KiB handshake record, slowly


@pytest.mark.parametrize(
    ("scheme", "trickler"),
    [("http", HTTP_ANSWER), ("https", TLS_HANDSHAKE)],
    indirect=["trickler"],
    ids=["answer", "tls-handshake"],
)
def test_a_receiver_that_trickles_is_cut_off_at_the_timeout(scheme, trickler, settings):
    settings.FLEET_WEBHOOK_ALLOW_PRIVATE = True
    settings.FLEET_ALERT_TIMEOUT_SECONDS = 1.0
    started = time.monotonic()
    delivery = deliver_once(f"{scheme}://127.0.0.1:{trickler}/hook")
    elapsed = time.monotonic() - started
    assert elapsed < 3, elapsed
    assert delivery.status == "retrying" and delivery.response_code is None
    assert "Timeout" in delivery.last_error or "timed out" in delivery.last_error


# ---- no private, loopback, link-local, unspecified or multicast destination -----------------

LOCAL_URLS = [
    "http://127.0.0.1/hook",
    "http://127.9.9.9:8080/hook",
    "http://2130706433/hook",  # 127.0.0.1 as one number: resolvers take it
    "http://localhost:9093/api/v2/alerts",
    "http://LOCALHOST./hook",
    "http://alerts.localhost/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[fe80::1]/hook",
    "http://0.0.0.0:80/hook",
    "http://[::]/hook",
    "http://224.0.0.1/hook",
    "http://[ff02::1]/hook",
    "http://10.1.2.3:9093/api/v2/alerts",
    "https://192.168.1.10/hook",
    "http://172.16.0.5/hook",
    "http://100.64.0.7/hook",
    "http://[fd12:3456::1]/hook",
]


@pytest.mark.parametrize("url", LOCAL_URLS)
def test_local_destinations_are_refused_when_the_webhook_is_given(admin_client, url):
    body = {"url": url, "events": ["gpu.unhealthy"], "secret": SECRET}
    answer = assert_error(
        admin_client.post("/api/v1/alerts/webhooks/", body, format="json"), 400, "webhook.invalid"
    )
    assert answer["details"] == {"field": "url"}
    assert not AlertWebhook.objects.exists()


def test_a_webhook_cannot_be_changed_to_a_local_destination(admin_client):
    webhook = hook("https://alerts.example.org/in", [alerts.HOST_OFFLINE])
    answer = admin_client.patch(
        f"/api/v1/alerts/webhooks/{webhook.pk}/",
        {"url": "http://169.254.169.254/latest/meta-data/"},
        format="json",
    )
    assert_error(answer, 400, "webhook.invalid")
    webhook.refresh_from_db()
    assert webhook_url(webhook) == "https://alerts.example.org/in"


@pytest.mark.parametrize("url", ["https://alerts.example.org/hook", "http://8.8.8.8/hook"])
def test_public_receivers_are_allowed(admin_client, url):
    body = {"url": url, "events": ["gpu.unhealthy"], "secret": SECRET}
    answer = admin_client.post("/api/v1/alerts/webhooks/", body, format="json")
    assert answer.status_code == 201, answer.content


@pytest.mark.parametrize(
    "url",
    [
        "http://10.1.2.3:9093/api/v2/alerts",
        "https://192.168.1.10/hook",
        "http://[fd12:3456::1]/hook",
        "https://alerts.internal.example/hook",  # a name: checked once resolved, when sent
    ],
)
def test_private_network_receivers_are_allowed_by_the_admins_setting(admin_client, settings, url):
    settings.FLEET_WEBHOOK_ALLOW_PRIVATE = True
    body = {"url": url, "events": ["gpu.unhealthy"], "secret": SECRET}
    answer = admin_client.post("/api/v1/alerts/webhooks/", body, format="json")
    assert answer.status_code == 201, answer.content


def test_the_setting_allows_local_destinations(admin_client, settings):
    settings.FLEET_WEBHOOK_ALLOW_PRIVATE = True
    body = {"url": "http://127.0.0.1:9093/hook", "events": ["gpu.unhealthy"], "secret": SECRET}
    answer = admin_client.post("/api/v1/alerts/webhooks/", body, format="json")
    assert answer.status_code == 201, answer.content


def test_a_name_resolving_to_loopback_is_refused_when_sent():
    with Receiver([200]) as receiver:
        port = receiver.server.server_address[1]
        delivery = deliver_once(f"http://localhost:{port}/hook")  # as stored before the check
    assert receiver.received == []
    assert delivery.status == "retrying" and delivery.response_code is None
    assert delivery.last_error.startswith("RefusedDestination")


@pytest.fixture
def dns(monkeypatch) -> dict[str, Any]:
    """Names under ``.test`` resolve to the addresses given here (each lookup counted)."""
    table: dict[str, Any] = {"names": {}, "lookups": 0}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".test"):
            table["lookups"] += 1
            found = []
            for address in table["names"][host]:
                found += real(address, port, *args, **kwargs)
            return found
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


def test_a_name_with_any_local_address_is_refused_when_sent(dns):
    dns["names"]["mixed.test"] = ["93.184.215.14", "169.254.169.254"]
    delivery = deliver_once("http://mixed.test/hook")
    assert delivery.last_error.startswith("RefusedDestination")
    assert "169.254.169.254" in delivery.last_error


def test_the_send_connects_to_the_address_checked_and_names_the_host(dns, settings):
    """One lookup, and the connection goes to the address it gave (a second lookup could give
    another: DNS rebinding); the request still names the host."""
    settings.FLEET_WEBHOOK_ALLOW_PRIVATE = True  # the receiver is on loopback
    seen: list[str] = []
    with Receiver([204]) as receiver:
        handler = receiver.server.RequestHandlerClass
        original = handler.do_POST

        def do_post(self: Any) -> None:
            seen.append(self.headers["Host"])
            original(self)

        handler.do_POST = do_post  # type: ignore[method-assign]
        port = receiver.server.server_address[1]
        dns["names"]["hooks.test"] = ["127.0.0.1"]
        delivery = deliver_once(f"http://hooks.test:{port}/hook")
    assert (delivery.status, delivery.response_code) == ("delivered", 204), delivery.last_error
    assert dns["lookups"] == 1
    assert seen == [f"hooks.test:{port}"]


@pytest.mark.parametrize("event", sorted(set(EVENTS) - set(RESOLVES)))
def test_every_event_renders_for_alertmanager(event):
    """A webhook in Alertmanager's format may subscribe to any event: each has an alert name
    (``agent.unsupported`` had none, and rendering it raised)."""
    from fleet.core.webhooks import alertmanager_body

    payload = {
        "event": event,
        "severity": SEVERITY[event],
        "summary": "s",
        "subject": {},
        "ts": "2026-12-04T00:00:00Z",
        "state": "firing",
    }
    (alert,) = alertmanager_body(payload)
    assert alert["labels"]["alertname"].startswith("Fleet")
