"""Every fault the simulated backend can inject, through the real processes: the right health
state, the replica re-placed on healthy capacity within 30 s, and recovery once it clears."""

from __future__ import annotations

import time

import pytest

from tests.e2e.stack import Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def fleet(stack: Stack):
    a = stack.add_agent("node-a", ["a30-24gb", "a30-24gb"])
    b = stack.add_agent("node-b", ["a30-24gb"])
    gpus = [*stack.gpus(a), *stack.gpus(b)]
    for gpu in gpus:
        status, op = stack.request(
            "PUT", f"/api/v1/gpus/{gpu['id']}/layout", {"mode": "mps", "mps": {}}
        )
        assert status == 202, op
        assert stack.wait_operation(op["id"])["status"] == "succeeded"
    status, deployment = stack.request(
        "POST",
        "/api/v1/deployments/",
        {"name": "asr", "kind": "mps", "memory_mib": 4096, "replicas": 1},
    )
    assert status == 201, deployment
    status, _ = stack.request(
        "POST", f"/api/v1/deployments/{deployment['id']}/place", {"gpu": gpus[0]["id"]}
    )
    assert status == 202
    return stack, a, gpus, deployment


def gpu(stack: Stack, gpu_id: int) -> dict:
    return dict(stack.get(f"/api/v1/gpus/{gpu_id}/"))


def xid_events(stack: Stack, gpu_id: int, xid: int) -> int:
    rows = stack.get(f"/api/v1/events/?kind=xid&gpu={gpu_id}&limit=500")["results"]
    return sum(1 for row in rows if row["xid"] == xid)


def replica_gpu(stack: Stack, deployment: dict) -> int | None:
    rows = stack.get(f"/api/v1/allocations/?deployment={deployment['id']}")["results"]
    return rows[0]["gpu"] if rows else None


def where_is_the_replica(stack: Stack, deployment: dict, gpus: list[dict]) -> tuple[int, int]:
    """(the GPU running the replica, its index on node-a or -1 on node-b)."""
    current = wait_until(lambda: replica_gpu(stack, deployment), 30, what="a placed replica")
    index = next((i for i, g in enumerate(gpus[:2]) if g["id"] == current), -1)
    return current, index


def fault_moves_the_replica(
    stack, agent, gpus, deployment, fault: dict, health: str, cause: str
) -> int:
    sick, index = where_is_the_replica(stack, deployment, gpus)
    if index < 0:  # the replica sits on node-b: bring it back to node-a so the fault hits it
        stack.request("POST", f"/api/v1/deployments/{deployment['id']}/evict", {})
        stack.request(
            "POST", f"/api/v1/deployments/{deployment['id']}/place", {"gpu": gpus[0]["id"]}
        )
        sick, index = where_is_the_replica(stack, deployment, gpus)
    started = time.monotonic()
    agent.fault(**fault, gpu=index)
    wait_until(
        lambda: (g := gpu(stack, sick))["health"] == health and g["health_cause"] == cause,
        30,
        what=f"{cause} detected",
    )
    assert gpu(stack, sick)["cordoned"]
    wait_until(
        lambda: replica_gpu(stack, deployment) not in (None, sick), 30, what="the replica re-placed"
    )
    assert time.monotonic() - started < 30
    moved_to = replica_gpu(stack, deployment)
    assert gpu(stack, moved_to)["health"] == "healthy"
    return sick


def heal(stack: Stack, gpu_id: int) -> None:
    status, op = stack.request("POST", f"/api/v1/gpus/{gpu_id}/heal", {})
    assert status == 200, op
    assert (gpu(stack, gpu_id)["health"], gpu(stack, gpu_id)["cordoned"]) == ("healthy", False)


def test_a_fatal_xid_moves_the_replica_and_an_operator_heals_the_gpu(fleet):
    stack, agent, gpus, deployment = fleet
    sick = fault_moves_the_replica(
        stack, agent, gpus, deployment, {"fault": "xid", "xid": 79}, "unhealthy", "xid"
    )
    heal(stack, sick)


def test_an_application_xid_leaves_the_gpu_alone(fleet):
    stack, agent, gpus, deployment = fleet
    current, index = where_is_the_replica(stack, deployment, gpus)
    if index < 0:
        pytest.skip("the replica is on node-b")
    before = xid_events(stack, current, 31)
    agent.fault(fault="xid", xid=13, gpu=index)
    agent.fault(fault="xid", xid=31, gpu=index)  # another application Xid: the barrier
    # The server stores each event of a host's socket and acts on it before the next, in the
    # order the agent sent them: once the Xid 31 is stored, the Xid 13 was acted on.
    wait_until(lambda: xid_events(stack, current, 31) > before, 30, what="the Xid 31 stored")
    assert xid_events(stack, current, 13) >= 1
    assert gpu(stack, current)["health"] == "healthy"
    assert replica_gpu(stack, deployment) == current


def test_uncorrectable_ecc_errors_move_the_replica(fleet):
    stack, agent, gpus, deployment = fleet
    sick = fault_moves_the_replica(
        stack, agent, gpus, deployment, {"fault": "ecc", "uncorrected": 2}, "unhealthy", "ecc"
    )
    heal(stack, sick)


def test_a_crashed_mps_daemon_moves_the_replica_and_recovers_when_restarted(fleet):
    stack, agent, gpus, deployment = fleet
    sick = fault_moves_the_replica(
        stack, agent, gpus, deployment, {"fault": "crash_mps"}, "unhealthy", "mps"
    )
    # The re-sent desired state restarts the daemon; its mps_up event heals the GPU.
    wait_until(
        lambda: (g := gpu(stack, sick))["health"] == "healthy" and not g["cordoned"],
        30,
        what="MPS recovery",
    )


def test_a_lost_gpu_moves_the_replica_and_recovers_when_it_is_back(fleet):
    stack, agent, gpus, deployment = fleet
    sick = fault_moves_the_replica(
        stack, agent, gpus, deployment, {"fault": "lose_gpu"}, "lost", "lost"
    )
    index = next(i for i, g in enumerate(gpus[:2]) if g["id"] == sick)
    agent.fault(fault="restore_gpu", gpu=index)
    wait_until(
        lambda: (g := gpu(stack, sick))["health"] == "healthy" and not g["cordoned"],
        30,
        what="the GPU back",
    )


def test_a_failing_apply_fails_the_operation_with_a_reason_and_a_slow_one_still_completes(fleet):
    stack, agent, gpus, deployment = fleet
    # A GPU of node-a (the faulty agent's) that the replica is not on: the earlier faults move
    # it to node-a's other GPU or to node-b, whichever the placement engine picks.
    holding = replica_gpu(stack, deployment)
    target = next(g for g in gpus[:2] if g["id"] != holding)
    agent.fault(fault="fail_apply", count=1)
    mig = {"mode": "mig", "instances": [{"profile": "4g.24gb", "start": 0}]}
    status, op = stack.request("PUT", f"/api/v1/gpus/{target['id']}/layout", mig)
    assert status == 202, op
    done = stack.wait_operation(op["id"])
    assert done["status"] == "failed" and done["reason"]
    agent.fault(fault="slow_apply", seconds=2)
    two = {
        "mode": "mig",
        "instances": [{"profile": "2g.12gb", "start": 0}, {"profile": "2g.12gb", "start": 2}],
    }
    status, op = stack.request("PUT", f"/api/v1/gpus/{target['id']}/layout", two)
    assert stack.wait_operation(op["id"])["status"] == "succeeded"
    agent.fault(fault="slow_apply", seconds=0)
