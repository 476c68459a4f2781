"""The gateway's activator on a real HAProxy (issue 24, scale to zero): a request to an endpoint
with no replica is held while one starts, then HAProxy retries it on the new copy (no byte of the
answer passes through the activator), a POST with its body too; an endpoint that does not scale
to zero answers 503 at once; a copy that never comes means a 503 after the deadline."""

from __future__ import annotations

import http.client
import http.server
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.endpoints.gateway import Gateway
from fleet.endpoints.haproxy.config import GatewayConfig
from fleet.endpoints.haproxy.sync import Route, Server, sync
from tests.endpoints.test_haproxy import HAPROXY, Copy, Listener, free_port

pytestmark = pytest.mark.skipif(not Path(HAPROXY).exists(), reason="needs Debian's haproxy")

WAITS = {0: 10.0, 2: 0.6}  # slot 0 and 2 scale to zero; slot 1 does not


@pytest.fixture
def gateway() -> Iterator[tuple[Gateway, list[int]]]:
    asked: list[int] = []

    def activate(slot: int) -> float | None:
        asked.append(slot)
        return WAITS.get(slot)

    directory = Path(tempfile.mkdtemp(prefix="fga-"))
    config = GatewayConfig(
        listen=f"127.0.0.1:{free_port()}", directory=directory, slots=4, metrics=None
    )
    running = Gateway(config, haproxy=HAPROXY, activate=activate)
    running.start()
    routes = [Route(slot, None, f"/s{slot}") for slot in range(3)]
    assert not sync(running.api, running.config, routes).errors
    yield running, asked
    running.close()
    shutil.rmtree(directory, ignore_errors=True)


def call(gateway: Gateway, method: str, path: str, body: bytes | None = None):
    host, _, port = gateway.config.listen.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, path, body=body)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def test_a_request_at_zero_replicas_is_held_and_answered_by_the_first_copy(gateway):
    running, asked = gateway
    copy = Copy("first copy")

    def cold_start() -> None:
        time.sleep(1.0)  # the replica starts
        route = Route(0, None, "/s0", (Server("r41", "127.0.0.1", copy.port),))
        sync(running.api, running.config, [route])

    try:
        threading.Thread(target=cold_start).start()
        started = time.monotonic()
        status, body = call(running, "GET", "/s0/v1/models")
        waited = time.monotonic() - started
        assert (status, body) == (200, "first copy")
        assert 1.0 <= waited < 8.0, waited
        assert asked == [0]
        deadline = time.monotonic() + 2  # the copy counts after it has answered
        while copy.served < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert copy.served == 1
        assert running.activator is not None and running.activator.released == 1
        # Now the copy is in the rotation: the next request goes straight to it.
        assert call(running, "GET", "/s0/again") == (200, "first copy")
        assert asked == [0]
    finally:
        copy.stop()


def test_a_held_post_reaches_the_copy_with_its_body(gateway):
    running, _ = gateway
    bodies: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    copy = Listener(("127.0.0.1", 0), Handler)
    threading.Thread(target=copy.serve_forever, daemon=True).start()
    port = copy.server_address[1]
    try:
        route = Route(0, None, "/s0", (Server("r42", "127.0.0.1", port),))
        threading.Timer(0.5, lambda: sync(running.api, running.config, [route])).start()
        status, body = call(running, "POST", "/s0/v1/completions", body=b'{"prompt": "hi"}')
        assert (status, body) == (200, "ok")
        assert bodies == [b'{"prompt": "hi"}']  # once: the activator answered nothing
    finally:
        copy.shutdown()
        copy.server_close()


def test_an_endpoint_that_does_not_scale_to_zero_answers_503_at_once(gateway):
    running, asked = gateway
    started = time.monotonic()
    status, body = call(running, "GET", "/s1/x")
    assert status == 503 and '"endpoint.no_replica"' in body
    assert time.monotonic() - started < 2.0 and asked == [1]
    # A flood at an endpoint with no replica is not a query each: refused unasked for a while.
    for _ in range(5):
        assert call(running, "GET", "/s1/x")[0] == 503
    assert asked == [1]


def test_a_copy_that_never_comes_is_a_503_after_the_deadline(gateway):
    running, _ = gateway
    started = time.monotonic()
    status, body = call(running, "GET", "/s2/x")
    assert status == 503 and '"endpoint.activation_timeout"' in body
    assert 0.5 <= time.monotonic() - started < 5.0
