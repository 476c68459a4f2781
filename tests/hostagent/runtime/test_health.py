"""Health checks on real sockets, and a container whose HTTP check fails (or passes) on the
host's loopback."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from hostagent.protocol import default_health, default_security
from hostagent.runtime.docker import DockerRuntime
from hostagent.runtime.health import http_check, tcp_check
from tests.hostagent.runtime.conftest import IMAGE
from tests.hostagent.runtime.fakes import wait_for, workload
from tests.hostagent.runtime.kit import allocation, desired, make_host


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server():
    codes = {"/health": 200, "/moved": 302, "/sick": 503}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(codes.get(self.path, 404))
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_http_passes_on_2xx_and_3xx_only(http_server):
    assert http_check(http_server, "/health", 2) is None
    assert http_check(http_server, "/moved", 2) is None
    assert "answered 503" in http_check(http_server, "/sick", 2)
    assert "ConnectionRefusedError" in http_check(free_port(), "/health", 2)


def test_tcp_passes_when_the_port_accepts(http_server):
    assert tcp_check(http_server, 2) is None
    assert tcp_check(free_port(), 2) is not None


# An http check reaches the workload on the host's loopback: only with the host's network.
HOST_NETWORK = {**default_security(), "user": "65534:65534", "host_network": True}


def http_health(port: int, path: str = "/health"):
    health = default_health()
    health.update(interval_s=1, timeout_s=1, retries=2)
    health["http"] = {"port": port, "path": path}
    return health


def test_a_container_whose_http_check_fails_is_not_running(tmp_path, docker_host):
    host = make_host(
        tmp_path, {"container": DockerRuntime(docker_host, image_pull="if-not-present")}
    )
    port = free_port()
    serve = (
        f"mkdir -p /tmp/www && echo ok > /tmp/www/health && exec httpd -f -p 127.0.0.1:{port} "
        "-h /tmp/www"
    )
    try:
        sick = workload(
            "container", image=IMAGE, command=["sleep", "60"], health=http_health(free_port())
        )
        well = workload(
            "container", image=IMAGE, command=["sh", "-c", serve], health=http_health(port)
        )
        host.apply(
            desired(
                host.gpu,
                1,
                [
                    allocation(1, sick, security=HOST_NETWORK),
                    allocation(2, well, "p1", security=HOST_NETWORK),
                ],
                ((5, 0), (5, 2)),
            )
        )
        wait_for(lambda: host.state(2) == "running")  # GET 127.0.0.1:port/health from the host
        wait_for(lambda: "health check not passed yet" in host.status(1)["message"])
        time.sleep(0.5)
        assert host.state(1) == "starting"
        assert "ConnectionRefusedError" in host.status(1)["message"]
    finally:
        host.supervisor.close()
