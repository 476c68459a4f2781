"""Moves without downtime, end to end with real processes: daphne, a Celery worker and beat on
Redis, PostgreSQL, and a ``fleet-agent`` running its replicas as real processes on simulated MIG
slices.

A moved replica's new copy runs before its old copy stops; a new copy that never passes its
health check is rolled back and the old copy keeps running; a drain of a GPU running two
replicas never leaves the deployment with fewer than two running.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import Agent, Stack, Watch, running, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TWO_3G = {
    "mode": "mig",
    "instances": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}],
}


@pytest.fixture(scope="module")
def fleet(stack: Stack) -> tuple[Stack, Agent, list[dict[str, Any]]]:
    agent = stack.add_agent("mv-1", ["h100-sxm5-80gb"] * 3, runtime="process")
    gpus = stack.gpus(agent)
    for gpu in gpus:
        status, op = stack.request("PUT", f"/api/v1/gpus/{gpu['id']}/layout", TWO_3G)
        assert status == 202, op
        assert stack.wait_operation(op["id"])["status"] == "succeeded"
    for gpu in gpus:
        wait_until(lambda g=gpu: stack.converged(g["id"]), 20, what="the MIG layouts")
    return stack, agent, gpus


def slice_of(stack: Stack, gpu_id: int, start: int) -> dict[str, Any]:
    rows = stack.get(f"/api/v1/partitions/?gpu={gpu_id}&limit=100")["results"]
    return dict(next(p for p in rows if p["kind"] == "mig" and p["start"] == start))


def deploy(stack: Stack, name: str, replicas: int, workload: dict[str, Any]) -> int:
    body = {"name": name, "replicas": replicas, "kind": "mig", "profile": "3g.40gb"}
    status, created = stack.request("POST", "/api/v1/deployments/", {**body, "workload": workload})
    assert status == 201, created
    return int(created["id"])


def place(stack: Stack, deployment_id: int, partition_id: int) -> None:
    status, op = stack.request(
        "POST", f"/api/v1/deployments/{deployment_id}/place", {"partition": partition_id}
    )
    assert status == 202, op


def allocations(stack: Stack, deployment_id: int) -> list[dict[str, Any]]:
    return list(stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"])


def wait_running(stack: Stack, deployment_id: int, n: int) -> None:
    wait_until(lambda: running(stack, deployment_id) == n, 30, what=f"{n} running")


def sleeper(out: Path) -> dict[str, Any]:
    return {
        "runtime": "process",
        "command": [
            "/bin/sh",
            "-c",
            'echo "$CUDA_VISIBLE_DEVICES" >> "$OUT/starts"; exec sleep 3600',
        ],
        "env": {"OUT": str(out)},
        "stop_grace_s": 2,
    }


def evict(stack: Stack, deployment_id: int) -> None:
    status, body = stack.request("POST", f"/api/v1/deployments/{deployment_id}/evict", {})
    assert status == 202, body
    wait_until(lambda: allocations(stack, deployment_id) == [], 15, what="slices free")


def test_a_moved_replica_runs_on_its_new_slice_before_the_old_copy_stops(fleet, tmp_path):
    stack, _, gpus = fleet
    deployment_id = deploy(stack, "mover", 1, sleeper(tmp_path))
    source, target = slice_of(stack, gpus[0]["id"], 0), slice_of(stack, gpus[2]["id"], 4)
    place(stack, deployment_id, source["id"])
    wait_running(stack, deployment_id, 1)
    (old,) = allocations(stack, deployment_id)
    with Watch(stack, deployment_id) as watch:
        status, op = stack.request(
            "POST", f"/api/v1/allocations/{old['id']}/move", {"partition": target["id"]}
        )
        assert status == 202, op
        done = stack.wait_operation(op["id"], timeout=60)
        wait_until(lambda: len(allocations(stack, deployment_id)) == 1, 15, what="old released")
    assert done["status"] == "succeeded", done
    (new,) = allocations(stack, deployment_id)
    assert new["partition"] == target["id"] and new["workload_state"] == "running"
    assert new["environment"]["CUDA_VISIBLE_DEVICES"] == target["uuid"]
    assert min(watch.samples) == 1, watch.samples  # never a moment without a running copy
    assert (tmp_path / "starts").read_text().split() == [source["uuid"], target["uuid"]]
    evict(stack, deployment_id)


def test_a_move_whose_new_copy_never_becomes_healthy_leaves_the_old_copy_running(fleet, tmp_path):
    stack, _, gpus = fleet
    source, target = slice_of(stack, gpus[0]["id"], 4), slice_of(stack, gpus[1]["id"], 0)
    workload = {
        **sleeper(tmp_path),
        # Healthy only on its first slice: the new copy runs but never passes.
        "env": {"OUT": str(tmp_path), "GOOD": source["uuid"]},
        "health": {
            "exec": {"command": ["/bin/sh", "-c", '[ "$CUDA_VISIBLE_DEVICES" = "$GOOD" ]']},
            "interval_s": 1,
            "timeout_s": 1,
        },
    }
    deployment_id = deploy(stack, "stuck", 1, workload)
    place(stack, deployment_id, source["id"])
    wait_running(stack, deployment_id, 1)
    (old,) = allocations(stack, deployment_id)
    status, op = stack.request(
        "POST",
        f"/api/v1/allocations/{old['id']}/move",
        {"partition": target["id"], "timeout_s": 10},
    )
    assert status == 202, op
    failed = stack.wait_operation(op["id"], timeout=40)
    assert failed["status"] == "failed" and "not running within 10 s" in failed["reason"], failed
    wait_until(lambda: len(allocations(stack, deployment_id)) == 1, 15, what="target released")
    (still,) = allocations(stack, deployment_id)
    assert still["id"] == old["id"] and still["workload_state"] == "running"
    assert running(stack, deployment_id) == 1
    evict(stack, deployment_id)


def test_a_drain_never_drops_the_running_count(fleet, tmp_path):
    stack, _, gpus = fleet
    deployment_id = deploy(stack, "pair", 2, sleeper(tmp_path))
    for start in (0, 4):
        place(stack, deployment_id, slice_of(stack, gpus[0]["id"], start)["id"])
    wait_running(stack, deployment_id, 2)
    with Watch(stack, deployment_id) as watch:
        status, op = stack.request("POST", f"/api/v1/gpus/{gpus[0]['id']}/drain", {})
        assert status == 202, op
        drained = stack.wait_operation(op["id"], timeout=90)
    assert drained["status"] == "succeeded", drained
    assert min(watch.samples) == 2, watch.samples
    placed = allocations(stack, deployment_id)
    assert len(placed) == 2 and all(a["gpu"] != gpus[0]["id"] for a in placed)
    assert "wait_moves" in [s["step"] for s in drained["payload"]["log"]]
    evict(stack, deployment_id)


def test_a_replica_of_two_gpus_moves_as_one_copy_without_a_gap(stack: Stack, tmp_path):
    """One workload on GPUs 0 and 1 moves to GPUs 2 and 3: the new copy (one process seeing
    both new GPUs) runs before the old one stops, and both old GPUs are freed together."""
    agent = stack.add_agent("mv-pair", ["h100-sxm5-80gb"] * 4, runtime="process")
    gpus = stack.gpus(agent)
    body = {"name": "pair-mover", "replicas": 1, "kind": "gpu", "gpu_count": 2}
    status, created = stack.request(
        "POST", "/api/v1/deployments/", {**body, "workload": sleeper(tmp_path)}
    )
    assert status == 201, created
    deployment_id = int(created["id"])
    status, op = stack.request(
        "POST", f"/api/v1/deployments/{deployment_id}/place", {"gpu": gpus[0]["id"]}
    )
    assert status in (200, 202), op
    wait_running(stack, deployment_id, 1)
    olds = sorted(allocations(stack, deployment_id), key=lambda a: a["gpu_slot"])
    assert [a["gpu"] for a in olds] == [gpus[0]["id"], gpus[1]["id"]]
    with Watch(stack, deployment_id) as watch:
        status, op = stack.request(
            "POST", f"/api/v1/allocations/{olds[0]['id']}/move", {"gpu": gpus[2]["id"]}
        )
        assert status == 202, op
        done = stack.wait_operation(op["id"], timeout=60)
        wait_until(lambda: len(allocations(stack, deployment_id)) == 2, 15, what="old released")
    assert done["status"] == "succeeded", done
    news = sorted(allocations(stack, deployment_id), key=lambda a: a["gpu_slot"])
    assert {a["gpu"] for a in news} == {gpus[2]["id"], gpus[3]["id"]}
    assert all(a["workload_state"] == "running" for a in news)
    assert min(watch.samples) == 1, watch.samples  # never a moment without a running copy
    uuids = {g["id"]: g["uuid"] for g in gpus}
    assert (tmp_path / "starts").read_text().split() == [
        f"{uuids[olds[0]['gpu']]},{uuids[olds[1]['gpu']]}",
        f"{uuids[news[0]['gpu']]},{uuids[news[1]['gpu']]}",
    ]
    evict(stack, deployment_id)
