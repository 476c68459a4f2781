"""Per-replica host ports on the real processes (issue 21): two teams' servers listening on the
same port run side by side on one host without the host's network, each replica on a host
port of its own that answers with its own content; the API lists each replica's ``address``,
``ports`` and ``ready``; an agent killed with SIGKILL adopts every replica once, with its ports.

Issue 21's finding: "With host network, one team's workload answered another team's health
check on the same port: a replica showed running while serving nothing."
"""

from __future__ import annotations

import http.client
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import NOBODY, Stack, wait_until
from tests.e2e.test_workloads import containers_of, image  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

IMAGE = "fleet-test/busybox:2"
SYSTEM_PYTHON = "/usr/bin/python3"
HEALTH = {"http": {"port": 8080, "path": "/who"}, "interval_s": 1, "timeout_s": 1}


def serve(words: str) -> dict[str, Any]:
    script = f"mkdir -p /tmp/w && echo {words} > /tmp/w/who && exec httpd -f -p 8080 -h /tmp/w"
    return {
        "runtime": "container",
        "user": NOBODY,
        "image": IMAGE,
        "command": ["sh", "-c", script],
        "ports": [{"name": "http", "port": 8080}],
        "health": HEALTH,
        "stop_grace_s": 1,
    }


def get(address: str, path: str = "/who") -> str:
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=3)
    try:
        connection.request("GET", path)
        return connection.getresponse().read().decode().strip()
    finally:
        connection.close()


def replicas(stack: Stack, deployment_id: int) -> list[dict[str, Any]]:
    return list(stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"])


def all_ready(stack: Stack, deployment_ids: list[int], count: int) -> list[dict[str, Any]]:
    rows = [r for d in deployment_ids for r in replicas(stack, d)]
    return rows if len(rows) == count and all(r["ready"] for r in rows) else []


@pytest.fixture(scope="module")
def teams(stack: Stack, image: str) -> dict[str, Any]:  # noqa: F811
    agent = stack.add_agent("pt-1", ["a100-sxm4-40gb"], runtime="docker")
    (gpu,) = stack.gpus(agent)
    body = {"mode": "mps", "mps": {"default_active_thread_percentage": 100}}
    status, op = stack.request("PUT", f"/api/v1/gpus/{gpu['id']}/layout", body)
    assert status == 202, op
    assert stack.wait_operation(op["id"])["status"] == "succeeded"
    for name in ("ports-a", "ports-b"):
        status, team = stack.request("POST", "/api/v1/teams/", {"name": name}, token="admin")
        assert status == 201, team
        policy = {"runtimes": ["container", "process"], "process_user": NOBODY}
        status, body = stack.request(
            "PUT", f"/api/v1/teams/{team['id']}/policy", policy, token="admin"
        )
        assert status == 200 and body["host_network"] is False, body
    return {"agent": agent}


def deploy(stack: Stack, name: str, team: str, replicas: int, workload: dict[str, Any]) -> int:
    body = {
        "name": name,
        "team": team,
        "kind": "mps",
        "memory_mib": 2048,
        "replicas": replicas,
        "auto": True,
        "workload": workload,
    }
    status, created = stack.request("POST", "/api/v1/deployments/", body)
    assert status == 201, created
    return int(created["id"])


def test_two_teams_serve_on_one_port_each_replica_on_its_own_host_port(
    stack: Stack, teams: dict[str, Any]
) -> None:
    agent = teams["agent"]
    a = deploy(stack, "web-a", "ports-a", 2, serve("team-a"))
    b = deploy(stack, "web-b", "ports-b", 1, serve("team-b"))
    rows = wait_until(lambda: all_ready(stack, [a, b], 3), 60, what="three replicas ready")
    hosts = {r["gpu"] for r in rows}
    assert len(hosts) == 1  # all on the one GPU: no port_in_use without the host's network
    ports = [r["ports"]["http"] for r in rows]
    assert len(set(ports)) == 3 and all(20000 <= port <= 29999 for port in ports)
    for row in rows:
        assert row["address"] == f"127.0.0.1:{row['ports']['http']}"
        assert get(row["address"]) == ("team-a" if row["deployment"] == a else "team-b")

    boxes = {r["id"]: containers_of(r["id"]) for r in rows}
    assert all(len(found) == 1 for found in boxes.values())
    agent.kill()  # SIGKILL
    time.sleep(1)
    agent.start(runtime="docker")
    wait_until(
        lambda: stack.get(f"/api/v1/hosts/{agent.host_id}/")["status"] == "ready",
        30,
        what="the agent back",
    )
    time.sleep(3)  # time enough to start a duplicate, were it to
    again = wait_until(lambda: all_ready(stack, [a, b], 3), 30, what="ready again")
    assert {r["id"]: r["ports"] for r in again} == {r["id"]: r["ports"] for r in rows}
    for row in again:
        (box,) = containers_of(row["id"])
        assert box["Id"] == boxes[row["id"]][0]["Id"] and row["restarts"] == 0
        assert get(row["address"]) == ("team-a" if row["deployment"] == a else "team-b")


def test_a_process_listens_on_its_host_port(stack: Stack, teams: dict[str, Any], tmp_path: Path):
    python = Path(SYSTEM_PYTHON)
    if not python.exists():
        pytest.skip(
            f"{SYSTEM_PYTHON} is missing (the process runs as nobody, who cannot read the venv)"
        )
    www = tmp_path / "www"
    www.mkdir()
    (www / "who").write_text("process\n")
    script = f'exec {python} -m http.server --bind 127.0.0.1 --directory {www} "$PORT"'
    deployment = deploy(
        stack,
        "proc",
        "ports-b",
        1,
        {
            "runtime": "process",
            "command": ["/bin/sh", "-c", script],
            "ports": [{"name": "http", "port": 8080}],
            "health": HEALTH,
            "stop_grace_s": 1,
        },
    )
    (row,) = wait_until(lambda: all_ready(stack, [deployment], 1), 60, what="the process ready")
    assert row["address"] == f"127.0.0.1:{row['ports']['http']}"
    assert get(row["address"]) == "process"
