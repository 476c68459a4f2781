"""Rolling updates end to end: daphne, a Celery worker and beat on Redis, PostgreSQL, a
``fleet-agent`` with the Docker runtime on simulated MIG slices, and a real Docker Engine with a
locally built image.

A new workload reaches both replicas without the deployment ever running fewer than two; a
rollout to an image that does not exist fails on its first new copy and leaves every replica on
the previous version, still running.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest

from fleet.bench.image import ensure_image
from tests.e2e.stack import NOBODY, Agent, Stack, Watch, running, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

IMAGE = "fleet-test/busybox:2"
FOUR_1G = {"mode": "mig", "instances": [{"profile": "1g.10gb", "start": s} for s in range(4)]}


def _docker_ok() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="module")
def fleet(stack: Stack) -> tuple[Stack, Agent, list[dict[str, Any]]]:
    if not _docker_ok():
        pytest.skip("no Docker daemon answers (.ci/run starts one: dockerd --bridge=none)")
    ensure_image(IMAGE)
    agent = stack.add_agent("roll-1", ["h100-sxm5-80gb"] * 2, runtime="docker")
    gpus = stack.gpus(agent)
    for gpu in gpus:
        status, op = stack.request("PUT", f"/api/v1/gpus/{gpu['id']}/layout", FOUR_1G)
        assert status == 202, op
        assert stack.wait_operation(op["id"])["status"] == "succeeded"
    for gpu in gpus:
        wait_until(lambda g=gpu: stack.converged(g["id"]), 20, what="the MIG layouts")
    return stack, agent, gpus


def container(command: list[str], image: str = IMAGE) -> dict[str, Any]:
    return {
        "runtime": "container",
        "user": NOBODY,
        "image": image,
        "command": command,
        "stop_grace_s": 1,
    }


def copies(stack: Stack, deployment_id: int) -> list[dict[str, Any]]:
    return list(stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"])


def roll(stack: Stack, deployment_id: int, workload: dict[str, Any]) -> dict[str, Any]:
    status, op = stack.request(
        "PATCH",
        f"/api/v1/deployments/{deployment_id}/",
        {"workload": workload, "rollout": {"max_surge": 1, "timeout_s": 30, "min_ready_s": 3}},
    )
    assert status == 202, op
    return stack.wait_operation(op["id"], timeout=120)


def test_a_rolling_update_keeps_every_replica_running_and_a_bad_image_rolls_back(fleet):
    stack, _, _ = fleet
    v1 = container(["sh", "-c", "trap 'exit 0' TERM; sleep 3601 & wait"])
    status, created = stack.request(
        "POST",
        "/api/v1/deployments/",
        {"name": "rolling", "kind": "mig", "profile": "1g.10gb", "replicas": 2, "auto": True,
         "workload": v1},
    )  # fmt: skip
    assert status == 201, created
    deployment_id = int(created["id"])
    wait_until(lambda: running(stack, deployment_id) == 2, 30, what="two replicas running")

    v2 = container(["sh", "-c", "trap 'exit 0' TERM; sleep 3602 & wait"])
    with Watch(stack, deployment_id) as watch:
        done = roll(stack, deployment_id, v2)
    assert done["status"] == "succeeded", done
    assert min(watch.samples) == 2, watch.samples
    wait_until(lambda: len(copies(stack, deployment_id)) == 2, 20, what="old copies stopped")
    assert {tuple(c["workload"]["command"]) for c in copies(stack, deployment_id)} == {
        tuple(v2["command"])
    }

    broken = container(v2["command"], image="fleet-test/does-not-exist:1")
    with Watch(stack, deployment_id) as watch:
        failed = roll(stack, deployment_id, broken)
    assert failed["status"] == "failed", failed
    assert "replica" in failed["reason"] and "previous workload" in failed["reason"], failed
    assert min(watch.samples) == 2, watch.samples
    wait_until(lambda: len(copies(stack, deployment_id)) == 2, 30, what="the bad copy gone")
    rows = copies(stack, deployment_id)
    assert {r["workload"]["image"] for r in rows} == {IMAGE}
    assert all(r["workload_state"] == "running" for r in rows)
    deployment = stack.get(f"/api/v1/deployments/{deployment_id}/")
    assert deployment["workload"]["image"] == IMAGE  # the deployment kept the previous version
    status, _ = stack.request("DELETE", f"/api/v1/deployments/{deployment_id}/")
    assert status == 204
