"""Fleet-wide layout rollouts end to end: daphne, a Celery worker and beat on Redis, PostgreSQL and
a ``fleet-agent`` with three simulated H100s.

A rollout to one 7g.80gb instance per GPU, one GPU at a time, pauses on the GPU where a process
Fleet does not know about keeps a partition busy (that GPU is rolled back, no later GPU is
touched), and once the process is gone, resume finishes it; the agent then holds the new layout
on every GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.stack import Agent, Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TWO_3G = {
    "mode": "mig",
    "instances": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}],
}
SEVEN = {"mode": "mig", "instances": [{"profile": "7g.80gb", "start": 0}]}


@pytest.fixture(scope="module")
def fleet(stack: Stack) -> tuple[Stack, Agent, list[dict[str, Any]]]:
    agent = stack.add_agent("lr-1", ["h100-sxm5-80gb"] * 3)
    gpus = stack.gpus(agent)
    for gpu in gpus:
        status, op = stack.request("PUT", f"/api/v1/gpus/{gpu['id']}/layout", TWO_3G)
        assert status == 202, op
        assert stack.wait_operation(op["id"])["status"] == "succeeded"
    for gpu in gpus:
        wait_until(lambda g=gpu: stack.converged(g["id"]), 20, what="the MIG layouts")
    return stack, agent, gpus


def rollout(stack: Stack, rollout_id: int) -> dict[str, Any]:
    return dict(stack.get(f"/api/v1/rollouts/{rollout_id}/"))


def observed(stack: Stack, gpu_id: int) -> list[tuple[int, int]]:
    gpu = stack.get(f"/api/v1/gpus/{gpu_id}/")
    instances = (gpu.get("observed") or {}).get("mig_instances") or []
    return sorted((i["profile_id"], i["start"]) for i in instances)


def test_a_rollout_pauses_on_a_busy_gpu_and_resume_finishes_it(fleet):
    stack, agent, gpus = fleet
    body = {"selector": {"hosts": [agent.host_id]}, "layout": SEVEN, "max_unavailable": 1}
    status, dry = stack.request("POST", "/api/v1/rollouts/", {**body, "dry_run": True})
    assert status == 200 and [g["gpu"] for g in dry["gpus"]] == [g["id"] for g in gpus], dry

    stray = agent.fault(fault="run_process", gpu=1, start=4, memory_mib=1024)
    status, started = stack.request("POST", "/api/v1/rollouts/", body)
    assert status == 202, started
    rollout_id = started["id"]
    paused = wait_until(
        lambda: (r := rollout(stack, rollout_id))["payload"].get("paused") and r,
        120,
        what="the rollout paused",
    )
    assert f"GPU {gpus[1]['id']}" in paused["payload"]["paused"]
    assert paused["status"] == "dispatched"
    assert observed(stack, gpus[0]["id"]) == [(0, 0)]  # the first GPU went through
    wait_until(lambda: observed(stack, gpus[1]["id"]) == [(9, 0), (9, 4)], 30, what="rolled back")
    assert observed(stack, gpus[2]["id"]) == [(9, 0), (9, 4)]  # not touched after the failure

    agent.fault(fault="kill_process", pid=stray["pid"])
    status, resumed = stack.request("POST", f"/api/v1/rollouts/{rollout_id}/resume", {})
    assert status == 200, resumed
    done = wait_until(
        lambda: (r := rollout(stack, rollout_id))["status"] != "dispatched" and r,
        180,
        what="the rollout finished",
    )
    assert done["status"] == "succeeded", done
    for gpu in gpus:
        wait_until(lambda g=gpu: observed(stack, g["id"]) == [(0, 0)], 30, what="the 7g layout")
        assert not stack.get(f"/api/v1/gpus/{gpu['id']}/")["cordoned"]
