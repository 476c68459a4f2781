"""Desired state reaches real agents through real processes (daphne, a Celery worker and beat
on Redis, PostgreSQL, two ``fleet-agent`` processes on the simulated backend), and converges
under faults: a killed worker, an agent killed mid-apply, a Redis restart."""

from __future__ import annotations

import pytest

from tests.e2e.stack import Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def fleet(stack: Stack):
    one = stack.add_agent("node-1", ["h100-sxm5-80gb", "a30-24gb"])
    two = stack.add_agent("node-2", ["a100-sxm4-40gb"])
    return stack, one, two


def set_layout(stack: Stack, gpu_id: int, body: dict) -> dict:
    status, op = stack.request("PUT", f"/api/v1/gpus/{gpu_id}/layout", body)
    assert status == 202, op
    return op


def test_enrolled_agents_apply_a_mig_layout_and_an_mps_policy_and_converge(fleet):
    stack, one, two = fleet
    h100, a30 = stack.gpus(one)
    (a100,) = stack.gpus(two)
    assert (h100["product_key"], a30["product_key"], a100["product_key"]) == (
        "h100-sxm5-80gb",
        "a30-24gb",
        "a100-sxm4-40gb",
    )
    mig = set_layout(
        stack,
        h100["id"],
        {
            "mode": "mig",
            "instances": [{"profile": "3g.40gb", "start": 4}, {"profile": "1g.10gb", "start": 0}],
        },
    )
    mps = set_layout(
        stack,
        a100["id"],
        {"mode": "mps", "mps": {"default_active_thread_percentage": 50, "max_clients": 8}},
    )
    assert stack.wait_operation(mig["id"])["status"] == "succeeded"
    assert stack.wait_operation(mps["id"])["status"] == "succeeded"
    wait_until(
        lambda: stack.converged(h100["id"]) and stack.converged(a100["id"]),
        20,
        what="observed == desired",
    )
    observed = stack.get(f"/api/v1/gpus/{h100['id']}/")["observed"]
    assert all(i["uuid"].startswith("MIG-") for i in observed["mig_instances"])

    # Telemetry flows: the MIG GPU reports no whole-GPU utilisation (null), never a made-up 0.
    def mig_sample():
        sample = stack.get(f"/api/v1/gpus/{h100['id']}/")["last_telemetry"]
        return sample if sample and sample["mig"] else None

    telemetry = wait_until(mig_sample, 10, what="telemetry with MIG instances")
    assert telemetry["utilization_gpu_percent"] is None
    assert telemetry["memory_used_mib"] is not None


def test_a_killed_worker_loses_no_change(fleet):
    stack, one, _ = fleet
    h100, _ = stack.gpus(one)
    stack.kill_worker()
    op = set_layout(
        stack, h100["id"], {"mode": "mig", "instances": [{"profile": "7g.80gb", "start": 0}]}
    )
    # The push task waits in Redis; the agent's heartbeats re-sync it meanwhile.
    assert stack.wait_operation(op["id"])["status"] == "succeeded"
    stack.start_worker()
    op = set_layout(
        stack,
        h100["id"],
        {
            "mode": "mig",
            "instances": [{"profile": "4g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}],
        },
    )
    assert stack.wait_operation(op["id"])["status"] == "succeeded"
    wait_until(
        lambda: stack.converged(h100["id"]), 20, what="convergence after the worker came back"
    )


def test_an_agent_killed_while_applying_converges_after_it_restarts(fleet):
    stack, one, _ = fleet
    h100, a30 = stack.gpus(one)
    one.fault(fault="slow_apply", seconds=3)
    op = set_layout(
        stack,
        a30["id"],
        {
            "mode": "mig",
            "instances": [{"profile": "2g.12gb", "start": 0}, {"profile": "1g.6gb", "start": 3}],
        },
    )
    wait_until(lambda: stack.operation(op["id"])["status"] == "dispatched", 10, what="dispatch")
    one.kill()  # mid-apply: no ack was sent
    assert stack.operation(op["id"])["status"] == "dispatched"
    one.start()  # same token file; a fresh simulated GPU (as after a reboot)
    assert stack.wait_operation(op["id"], 40)["status"] == "succeeded"
    wait_until(
        lambda: stack.converged(a30["id"]) and stack.converged(h100["id"]),
        30,
        what="convergence after the restart",
    )


def test_a_redis_restart_loses_no_change(fleet):
    stack, _, two = fleet
    (a100,) = stack.gpus(two)
    stack.restart_redis()
    op = wait_until(
        lambda: (
            (
                r := stack.request(
                    "PUT",
                    f"/api/v1/gpus/{a100['id']}/layout",
                    {"mode": "mig", "instances": [{"profile": "3g.20gb", "start": 0}]},
                )
            )[0]
            == 202
            and r[1]
        ),
        30,
        what="the API after the Redis restart",
    )
    assert stack.wait_operation(op["id"], 40)["status"] == "succeeded"
    wait_until(lambda: stack.converged(a100["id"]), 30, what="convergence after the Redis restart")


def test_a_busy_partition_is_never_destroyed_and_the_operation_fails_with_the_reason(fleet):
    stack, one, _ = fleet
    h100, _ = stack.gpus(one)
    wait_until(lambda: stack.converged(h100["id"]), 30, what="a settled GPU")
    pid = one.fault(fault="run_process", gpu=0, start=4, memory_mib=2048)["pid"]
    op = set_layout(
        stack, h100["id"], {"mode": "mig", "instances": [{"profile": "7g.80gb", "start": 0}]}
    )
    done = stack.wait_operation(op["id"])
    assert done["status"] == "failed"
    assert "in_use" in done["reason"] and str(pid) in done["reason"]
    observed = stack.get(f"/api/v1/gpus/{h100['id']}/")["observed"]
    assert (9, 4) in {(i["profile_id"], i["start"]) for i in observed["mig_instances"]}


def test_a_token_used_from_the_wrong_host_is_refused(fleet):
    stack, one, _ = fleet
    before = stack.get("/api/v1/gpus/")["count"]
    intruder_dir = one.dir.parent / "agent-intruder"
    intruder_dir.mkdir(exist_ok=True)
    (intruder_dir / "token.json").write_text(one.token_file.read_text())
    from tests.e2e.stack import Agent

    intruder = Agent(stack, "intruder", ["b200-180gb"])
    stack.agents.append(intruder)
    intruder.start(hostname="intruder")
    wait_until(
        lambda: (
            "4403" in intruder.log() or "refused" in intruder.log() or "closed" in intruder.log()
        ),
        20,
        what="the refusal",
    )
    assert stack.get("/api/v1/gpus/")["count"] == before
    assert "agent.wrong_host" in stack.log("daphne") or "refused agent" in stack.log("daphne")
    intruder.kill()


def test_an_agent_on_the_rest_fallback_enrols_reports_and_applies(fleet):
    stack, _, _ = fleet
    poller = stack.add_agent("node-rest", ["a30-24gb"], transport="rest")
    (gpu,) = stack.gpus(poller)
    op = set_layout(
        stack, gpu["id"], {"mode": "mig", "instances": [{"profile": "4g.24gb", "start": 0}]}
    )
    assert stack.wait_operation(op["id"])["status"] == "succeeded"
    wait_until(lambda: stack.converged(gpu["id"]), 20, what="the polling agent applying the layout")
    # A reset loses the MIG instances; the polling agent notices the drift and applies again.
    poller.fault(fault="reset_gpu", gpu=0)
    wait_until(lambda: "drifted: applying it again" in poller.log(), 30, what="the drift noticed")
    wait_until(lambda: stack.converged(gpu["id"]), 20, what="the layout applied again")
