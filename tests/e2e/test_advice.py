"""The layout advisor end to end: daphne, a Celery worker and beat on Redis, PostgreSQL and a
``fleet-agent`` with two simulated H100s in 2 x 3g.40gb.

A 3g replica runs; two 4g.40gb replicas wait (no 4g fits). The advisor's proposal, applied as a
rollout through the API exactly as it answers, reshapes the GPUs (a GPU whose running replica
must move is drained, the replica moving make before break), and the engine then places the
waiting replicas: both are placed on the agent's new 4g instances, and the 3g replica is still
placed.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.stack import Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TWO_3G = {
    "mode": "mig",
    "instances": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}],
}


def observed(stack: Stack, gpu_id: int) -> list[tuple[int, int]]:
    gpu = stack.get(f"/api/v1/gpus/{gpu_id}/")
    instances = (gpu.get("observed") or {}).get("mig_instances") or []
    return sorted((i["profile_id"], i["start"]) for i in instances)


def deployment(stack: Stack, deployment_id: int) -> dict[str, Any]:
    return dict(stack.get(f"/api/v1/deployments/{deployment_id}/"))


def test_an_applied_advice_rollout_lets_the_waiting_replicas_run(stack: Stack) -> None:
    agent = stack.add_agent("adv-1", ["h100-sxm5-80gb"] * 2)
    gpus = stack.gpus(agent)
    for gpu in gpus:
        status, op = stack.request("PUT", f"/api/v1/gpus/{gpu['id']}/layout", TWO_3G)
        assert status == 202, op
        assert stack.wait_operation(op["id"])["status"] == "succeeded"
    for gpu in gpus:
        wait_until(lambda g=gpu: stack.converged(g["id"]), 20, what="the MIG layouts")
    selector = {"hosts": [agent.host_id]}
    status, chat = stack.request(
        "POST",
        "/api/v1/deployments/",
        {"name": "adv-chat", "kind": "mig", "profile": "3g.40gb", "replicas": 1, "auto": True},
    )
    assert status == 201, chat
    status, big = stack.request(
        "POST",
        "/api/v1/deployments/",
        {"name": "adv-big", "kind": "mig", "profile": "4g.40gb", "replicas": 2},
    )
    assert status == 201, big
    assert deployment(stack, big["id"])["placed_replicas"] == 0

    advice = stack.get("/api/v1/capacity/advice?product=h100-sxm5-80gb")
    assert advice["solver"]["status"] == "optimal", advice["solver"]
    assert {w["deployment"]: w["placed"] for w in advice["waiting"]}["adv-big"] == 2
    body = advice["rollout"]
    assert body is not None and big["id"] in body["place_waiting"]
    assert set(body["selector"]["gpus"]) <= {g["id"] for g in gpus}
    status, started = stack.request(
        "POST", "/api/v1/rollouts/", {**body, "selector": {**body["selector"], **selector}}
    )
    assert status == 202, started
    done = wait_until(
        lambda: (
            (r := stack.get(f"/api/v1/rollouts/{started['id']}/"))["status"] != "dispatched" and r
        ),
        200,
        what="the advice rollout finished",
    )
    assert done["status"] == "succeeded", done["payload"]
    wait_until(
        lambda: deployment(stack, big["id"])["placed_replicas"] == 2, 60, what="4g replicas placed"
    )
    assert deployment(stack, chat["id"])["placed_replicas"] == 1
    for gpu in gpus:  # the agent holds a 4g instance (profile 5) on each GPU
        wait_until(lambda g=gpu: (5, 0) in observed(stack, g["id"]), 30, what="the 4g instances")
    # Another user: the advisor allows one solve per user per FLEET_ADVICE_MIN_INTERVAL_SECONDS.
    again = stack.get("/api/v1/capacity/advice?product=h100-sxm5-80gb", token="admin")
    assert not any(w["deployment"] == "adv-big" for w in again["waiting"])
    for name in ("adv-big", "adv-chat"):
        pk = big["id"] if name == "adv-big" else chat["id"]
        stack.request("DELETE", f"/api/v1/deployments/{pk}/")
