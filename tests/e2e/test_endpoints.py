"""Endpoints on the real processes (issue 23): daphne, a Celery worker and beat, an agent running
its replicas as processes (and one running them as containers on a real Docker Engine), and
``manage.py fleet_gateway`` running Debian's HAProxy. A caller sends requests through the gateway
without a pause while every replica of the deployment moves to another GPU and then rolls out a
new version: none fails.
"""

from __future__ import annotations

import http.client
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import BIN, Stack, wait_until
from tests.e2e.test_workloads import image  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SYSTEM_PYTHON = Path("/usr/bin/python3")
HAPROXY = Path("/usr/sbin/haproxy")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server(www: Path, version: str) -> dict[str, Any]:
    script = f'exec {SYSTEM_PYTHON} -m http.server --bind 127.0.0.1 --directory {www} "$PORT"'
    return {
        "runtime": "process",
        "command": ["/bin/sh", "-c", script],
        "env": {"VERSION": version},
        "ports": [{"name": "http", "port": 8000}],
        "health": {"http": {"port": 8000, "path": "/who"}, "interval_s": 1, "timeout_s": 1},
        "stop_grace_s": 2,
    }


class Caller:
    """Requests through the gateway, one after the other on each of ``threads`` connections,
    until stopped; every answer that is not a 200 is a failure, with when it happened."""

    def __init__(self, port: int, path: str, threads: int = 2, pause_s: float = 0.01) -> None:
        self.port, self.path, self.pause_s = port, path, pause_s
        self.ok = 0
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def _run(self) -> None:
        while not self.stop.is_set():
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                connection.request("GET", self.path)
                answer = connection.getresponse()
                answer.read()
                if answer.status == 200:
                    self.ok += 1
                else:
                    self.failed.append(f"{answer.status} at {time.strftime('%X')}")
            except (OSError, http.client.HTTPException) as exc:
                self.failed.append(f"{exc!r} at {time.strftime('%X')}")
            finally:
                connection.close()
            time.sleep(self.pause_s)

    def __enter__(self) -> Caller:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def start_gateway(stack: Stack, name: str) -> tuple[int, Path]:
    """``manage.py fleet_gateway`` as the process ``name`` on a free port: its port and its
    directory (remove it when done)."""
    port = free_port()
    directory = Path(f"/tmp/fgw-{name}-{port}")
    shutil.rmtree(directory, ignore_errors=True)
    stack.spawn(
        name,
        [
            str(BIN / "python"),
            "manage.py",
            "fleet_gateway",
            "--listen",
            f"127.0.0.1:{port}",
            "--directory",
            str(directory),
            "--metrics",
            "none",
        ],
    )
    return port, directory


def deployed_on(
    stack: Stack, body: dict[str, Any], gpus: list[int], *, ready_within_s: float
) -> int:
    """The deployment ``body`` created and one replica placed on each of ``gpus``, every one
    ready (running, its health check passing); its id."""
    status, created = stack.request("POST", "/api/v1/deployments/", body)
    assert status == 201, created
    deployment_id = int(created["id"])
    for gpu in gpus:
        status, op = stack.request(
            "POST", f"/api/v1/deployments/{deployment_id}/place", {"gpu": gpu}
        )
        assert status in (200, 201, 202), op
    wait_until(
        lambda: sum(r["ready"] for r in replicas(stack, deployment_id)) == len(gpus),
        ready_within_s,
        what=f"{len(gpus)} replicas of {body['name']} ready",
    )
    return deployment_id


def replicas(stack: Stack, deployment_id: int) -> list[dict[str, Any]]:
    return list(stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"])


def test_a_caller_sees_no_failed_request_while_every_replica_moves_and_rolls_out(
    stack: Stack, tmp_path: Path
) -> None:
    for needed in (SYSTEM_PYTHON, HAPROXY):
        if not needed.exists():
            pytest.skip(f"{needed} is missing")
    stack.allow_workloads()
    agent = stack.add_agent("ep-1", ["a100-sxm4-40gb"] * 4, runtime="process")
    gpus = [g["id"] for g in stack.gpus(agent)]
    www = tmp_path / "www"
    www.mkdir()
    (www / "who").write_text("model\n")
    body = {
        "name": "ep-model",
        "kind": "gpu",
        "gpu_count": 1,
        "replicas": 2,
        "workload": server(www, "1"),
        # A short drain: the copies still leave the balancers before they stop, quickly.
        "endpoint": {"path_prefix": "/ep-model", "drain_s": 1},
    }
    deployment_id = deployed_on(stack, body, gpus[:2], ready_within_s=60)
    port, directory = start_gateway(stack, "gateway")
    try:
        try:
            wait_until(lambda: _answers(port, "/ep-model/who"), 30, what="the gateway routing")
        except AssertionError as exc:
            log = stack.log("gateway")[-3000:]
            raise AssertionError(f"{exc}; the gateway's log:\n{log}") from None
        with Caller(port, "/ep-model/who") as caller:
            time.sleep(1)  # traffic before the changes: a window of calls, not a wait
            moves = zip(sorted(replicas(stack, deployment_id), key=_id), gpus[2:], strict=True)
            for replica, target in moves:
                status, op = stack.request(
                    "POST", f"/api/v1/allocations/{replica['id']}/move", {"gpu": target}
                )
                assert status == 202, op
                assert stack.wait_operation(op["id"], 60)["status"] == "succeeded"
            status, op = stack.request(
                "PATCH",
                f"/api/v1/deployments/{deployment_id}/",
                {
                    "workload": server(www, "2"),
                    "rollout": {"max_surge": 1, "max_unavailable": 0, "min_ready_s": 1},
                },
            )
            assert status == 202, op
            done = stack.wait_operation(op["id"], 90)
            assert done["status"] == "succeeded", str(done)[:4000]
            time.sleep(1)  # and after them
        assert caller.failed == [], caller.failed
        assert caller.ok > 50, caller.ok
        rows = replicas(stack, deployment_id)
        assert len(rows) == 2 and {r["gpu"] for r in rows} <= set(gpus)
    finally:
        stack.terminate("gateway")
        stack.request("DELETE", f"/api/v1/deployments/{deployment_id}/")
        shutil.rmtree(directory, ignore_errors=True)


def _id(row: dict[str, Any]) -> int:
    return int(row["id"])


def _answers(port: int, path: str) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
    try:
        connection.request("GET", path)
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def container_server(tag: str, version: str) -> dict[str, Any]:
    """busybox's httpd in a container of the tests' own image, as a user of no account."""
    script = (
        'mkdir -p /tmp/www && echo model > /tmp/www/who && exec httpd -f -p "$PORT" -h /tmp/www'
    )
    return {
        "runtime": "container",
        "image": tag,
        "user": "65534:65534",
        "command": ["sh", "-c", script],
        "env": {"VERSION": version},
        "ports": [{"name": "http", "port": 8000}],
        "health": {"http": {"port": 8000, "path": "/who"}, "interval_s": 1, "timeout_s": 1},
        "stop_grace_s": 2,
    }


def test_a_caller_sees_no_failed_request_while_docker_replicas_move(
    stack: Stack,
    image: str,  # noqa: F811
) -> None:
    """The same through the Docker runtime: containers on a real Docker Engine, each replica
    moved once to another GPU, then a rolling update, while requests flow through the
    gateway."""
    if not HAPROXY.exists():
        pytest.skip(f"{HAPROXY} is missing")
    # The team's containers get a network of their own (the restricted default): each copy's
    # port is published on a host port of its own, so two copies share a host.
    status, teams = stack.request("GET", "/api/v1/teams/?slug=default", token="admin")
    (team,) = [t for t in teams["results"] if t["slug"] == "default"]
    status, policy = stack.request(
        "PUT",
        f"/api/v1/teams/{team['id']}/policy",
        {"runtimes": ["container"], "host_network": False},
        token="admin",
    )
    assert status == 200, policy
    agent = stack.add_agent("ep-d", ["a100-sxm4-40gb"] * 4, runtime="docker")
    gpus = [g["id"] for g in stack.gpus(agent)]
    body = {
        "name": "ep-docker",
        "kind": "gpu",
        "gpu_count": 1,
        "replicas": 2,
        "workload": container_server(image, "1"),
        "endpoint": {"path_prefix": "/ep-docker", "drain_s": 1},
    }
    deployment_id = deployed_on(stack, body, gpus[:2], ready_within_s=90)
    port, directory = start_gateway(stack, "gateway-docker")
    try:
        wait_until(lambda: _answers(port, "/ep-docker/who"), 30, what="the gateway routing")
        with Caller(port, "/ep-docker/who") as caller:
            time.sleep(1)
            moves = zip(sorted(replicas(stack, deployment_id), key=_id), gpus[2:], strict=True)
            for replica, target in moves:
                status, op = stack.request(
                    "POST", f"/api/v1/allocations/{replica['id']}/move", {"gpu": target}
                )
                assert status == 202, op
                assert stack.wait_operation(op["id"], 90)["status"] == "succeeded"
            wait_until(  # the old copies drained, stopped and gone
                lambda: {r["gpu"] for r in replicas(stack, deployment_id)} == set(gpus[2:]),
                30,
                what="the old copies gone",
            )
            status, op = stack.request(
                "PATCH",
                f"/api/v1/deployments/{deployment_id}/",
                {
                    "workload": container_server(image, "2"),
                    "rollout": {"max_surge": 1, "max_unavailable": 0, "min_ready_s": 1},
                },
            )
            assert status == 202, op
            done = stack.wait_operation(op["id"], 120)
            assert done["status"] == "succeeded", str(done)[:4000]
            time.sleep(1)
        assert caller.failed == [], caller.failed
        assert caller.ok > 20, caller.ok
        wait_until(  # the old version's copies drained, stopped and gone
            lambda: (
                sorted(r["workload"]["env"]["VERSION"] for r in replicas(stack, deployment_id))
                == ["2", "2"]
            ),
            30,
            what="the old version's copies gone",
        )
    finally:
        stack.terminate("gateway-docker")
        stack.request("DELETE", f"/api/v1/deployments/{deployment_id}/")
        shutil.rmtree(directory, ignore_errors=True)
        stack.allow_workloads()
