"""The engine's defrag for the head of the queue (``FLEET_QUEUE_DEFRAG``), end to end with real
processes: daphne, a Celery worker and beat (whose what-would-it-take refresh starts it) on
Redis, PostgreSQL, and a ``fleet-agent`` running the replicas as real processes on simulated MIG
slices of two H100s.

Each GPU holds one 1g.10gb replica in the middle of its grid, so an engine-placed 7g.80gb
replica fits nowhere and waits; one move would make room. Nobody applies the plan: beat's
refresh finds it at the head of the queue and carries it out, make before break (the moved
deployment never runs fewer replicas), and the 7g replica is placed and runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import Stack, Watch, launched, running, wait_until
from tests.e2e.test_moves import slice_of
from tests.e2e.test_reclaim import allocations, sleeper, team

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SAMPLE_MS = 50  # Watch's sampling period


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with launched(tmp_path_factory.mktemp("stack"), env={"FLEET_WIT_REFRESH_SECONDS": "2"}) as up:
        yield up


def create(stack: Stack, body: dict[str, Any], out: Path) -> dict[str, Any]:
    status, created = stack.request(
        "POST", "/api/v1/deployments/", {**body, "workload": sleeper(out)}
    )
    assert status == 201, created
    return dict(created)


def defrags(stack: Stack, deployment_id: int) -> list[dict[str, Any]]:
    rows = stack.get(f"/api/v1/operations/?kind=defrag&deployment={deployment_id}")["results"]
    return list(rows)


def test_beats_refresh_defragments_for_the_queues_head_without_a_gap(stack, tmp_path):
    agent = stack.add_agent("qd-1", ["h100-sxm5-80gb"] * 2, runtime="process")
    gpus = [g["id"] for g in stack.gpus(agent)]
    for gpu_id in gpus:  # a 1g in the middle of each grid: no 7g fits anywhere
        body = {"mode": "mig", "instances": [{"profile": "1g.10gb", "start": 3}]}
        status, op = stack.request("PUT", f"/api/v1/gpus/{gpu_id}/layout", body)
        assert status == 202, op
        assert stack.wait_operation(op["id"])["status"] == "succeeded"
        wait_until(lambda g=gpu_id: stack.converged(g), 20, what="the MIG layouts")
    owner = team(stack, "defrag-demo", {"mig_compute_slices": 14})
    small = create(
        stack,
        {"name": "small", "replicas": 2, "kind": "mig", "profile": "1g.10gb", "team": owner},
        tmp_path,
    )
    for gpu_id in gpus:  # an operator places them, one on each GPU's 1g
        target = slice_of(stack, gpu_id, 3)
        status, op = stack.request(
            "POST", f"/api/v1/deployments/{small['id']}/place", {"partition": target["id"]}
        )
        assert status == 202, op
    assert sorted(a["gpu"] for a in allocations(stack, small["id"])) == sorted(gpus)
    wait_until(lambda: running(stack, small["id"]) == 2, 30, what="the small replicas run")

    with Watch(stack, small["id"]) as watch:
        big = create(
            stack,
            {
                "name": "big",
                "replicas": 1,
                "kind": "mig",
                "profile": "7g.80gb",
                "team": owner,
                "auto": True,
                "wait": True,
            },
            tmp_path,
        )
        assert big["placed_replicas"] == 0  # it fits nowhere: it waits
        wait_until(lambda: defrags(stack, big["id"]) != [], 30, what="beat's refresh defrags")
        (operation,) = defrags(stack, big["id"])
        done = stack.wait_operation(operation["id"], timeout=90)
        wait_until(lambda: len(allocations(stack, small["id"])) == 2, 30, what="the old copy")
    assert done["status"] == "succeeded", done
    assert done["requested_by"] is None  # the engine's, not a person's
    assert [step["kind"] for step in done["payload"]["plan"]] == ["move"]
    (placed,) = allocations(stack, big["id"])
    wait_until(lambda: running(stack, big["id"]) == 1, 30, what="the 7g replica runs")
    left = {a["gpu"] for a in allocations(stack, small["id"])}
    assert left == {g for g in gpus if g != placed["gpu"]}  # both 1g now share the other GPU
    gap_ms = SAMPLE_MS * sum(1 for n in watch.samples if n < 2)
    assert gap_ms == 0 and len(watch.samples) > 10, watch.samples
