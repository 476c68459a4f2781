"""Health checks on real sockets, and a container whose HTTP check fails (or passes) on the
host's loopback."""

from __future__ import annotations

import http.server
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from hostagent.protocol import default_health, default_security
from hostagent.runtime.docker import DockerRuntime
from hostagent.runtime.health import http_check, tcp_check
from hostagent.runtime.process import ProcessRuntime
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


def tcp_health(port: int):
    health = default_health()
    health.update(interval_s=1, timeout_s=1, retries=2)
    health["tcp"] = {"port": port}
    return health


def test_a_bridged_containers_check_goes_to_its_own_address_not_to_dockers_proxy(
    tmp_path, docker_host
):
    host = make_host(
        tmp_path, {"container": DockerRuntime(docker_host, image_pull="if-not-present")}
    )
    serve = "mkdir -p /tmp/www && echo ok > /tmp/www/health && exec httpd -f -p 8080 -h /tmp/www"
    try:
        silent = workload("container", image=IMAGE, command=["sleep", "60"], health=tcp_health(80))
        well = workload(
            "container",
            image=IMAGE,
            command=["sh", "-c", serve],
            ports=[{"name": "web", "port": 8080}],
            health=http_health(8080),
        )
        host.apply(
            desired(
                host.gpu, 1, [allocation(1, silent), allocation(2, well, "p1")], ((5, 0), (5, 2))
            )
        )
        wait_for(lambda: host.state(2) == "running", timeout_s=15)
        published = host.status(2)["ports"]["web"]
        assert http_check(published, "/health", 2) is None  # served on its host port
        wait_for(lambda: "connect :80" in host.status(1)["message"], timeout_s=15)
        # Docker's proxy accepts on the silent replica's host port though nothing listens
        # behind it: a check there would have passed.
        silent_port = host.status(1)["ports"]["health"]
        assert tcp_check(silent_port, 2) is None
        assert host.state(1) == "starting"
    finally:
        host.supervisor.close()


LISTEN = (
    "import os, socket, time\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', int(os.environ['FLEET_PORT_API'])))\n"
    "s.listen()\n"
    "time.sleep(60)\n"
)


def test_a_process_passes_its_check_only_on_its_own_socket_not_a_squatters(tmp_path, kill_sessions):
    runtime = ProcessRuntime(tmp_path / "state", as_agent_user=True)
    host = make_host(tmp_path, {"process": runtime}, agent_runtime="process")
    ports = [{"name": "api", "port": 7000}]
    try:
        listens = workload(
            "process", command=[sys.executable, "-c", LISTEN], ports=ports, health=tcp_health(7000)
        )
        idle = workload("process", command=["sleep", "60"], ports=ports, health=tcp_health(7000))
        host.apply(
            desired(
                host.gpu, 1, [allocation(1, listens), allocation(2, idle, "p1")], ((5, 0), (5, 2))
            )
        )
        wait_for(lambda: host.state(1) == "running", timeout_s=15)
        # Another team's program takes the idle replica's port: it answers, but is not the
        # replica.
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", host.status(2)["ports"]["api"]))
            squatter.listen()
            wait_for(lambda: "no process of this replica listens" in host.status(2)["message"])
            assert host.state(2) == "starting"
        env = dict(
            line.split("=", 1)
            for line in Path(f"/proc/{host.status(1)['pids'][0]}/environ").read_text().split("\0")
            if "=" in line
        )
        assert env["PORT"] == env["FLEET_PORT_API"] == str(host.status(1)["ports"]["api"])
    finally:
        host.supervisor.close()
        kill_sessions.extend(f.running.pid for f in runtime.find() if f.running.pid)
