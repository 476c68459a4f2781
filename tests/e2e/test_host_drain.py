"""A host drain without downtime, end to end with real processes: daphne, a Celery worker and
beat on Redis, PostgreSQL, and two ``fleet-agent`` hosts running replicas as real processes on
simulated MIG slices.

The host running both replicas of a deployment is drained while another host has room: each
replica moves make before break, one at a time, the running count never drops (sampled every
50 ms), and the host ends in ``maintenance``.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.stack import Stack, wait_until
from tests.e2e.test_moves import TWO_3G, Watch, allocations, deploy, place, sleeper, slice_of
from tests.e2e.test_moves import wait_running as wait_running_count

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _mig_host(stack: Stack, name: str) -> tuple[int, dict]:
    agent = stack.add_agent(name, ["h100-sxm5-80gb"], runtime="process")
    (gpu,) = stack.gpus(agent)
    status, op = stack.request("PUT", f"/api/v1/gpus/{gpu['id']}/layout", TWO_3G)
    assert status == 202, op
    assert stack.wait_operation(op["id"])["status"] == "succeeded"
    wait_until(lambda: stack.converged(gpu["id"]), 20, what=f"{name}'s MIG layout")
    return int(agent.host_id), gpu


def test_a_host_drain_never_drops_the_running_count_and_ends_in_maintenance(stack, tmp_path):
    source_host, source_gpu = _mig_host(stack, "hd-src")
    _, target_gpu = _mig_host(stack, "hd-dst")
    deployment_id = deploy(stack, "host-pair", 2, sleeper(tmp_path))
    for start in (0, 4):
        place(stack, deployment_id, slice_of(stack, source_gpu["id"], start)["id"])
    wait_running_count(stack, deployment_id, 2)

    started = time.monotonic()
    with Watch(stack, deployment_id) as watch:
        status, op = stack.request("POST", f"/api/v1/hosts/{source_host}/drain", {})
        assert status == 202, op
        assert op["kind"] == "drain_host"
        drained = stack.wait_operation(op["id"], timeout=120)
    took_s = time.monotonic() - started

    assert drained["status"] == "succeeded", drained
    assert min(watch.samples) == 2, watch.samples
    host = stack.get(f"/api/v1/hosts/{source_host}/")
    assert host["status"] == "maintenance"
    placed = allocations(stack, deployment_id)
    assert len(placed) == 2 and {a["gpu"] for a in placed} == {target_gpu["id"]}
    assert all(a["workload_state"] == "running" for a in placed)
    assert len(drained["payload"]["moves"]) == 2
    print(
        f"host drain: {took_s:.1f} s for 2 replicas, {len(watch.samples)} samples, "
        f"running min {min(watch.samples)} max {max(watch.samples)}"
    )
    # Nothing new goes to a host in maintenance until it is uncordoned.
    targets = stack.get(f"/api/v1/deployments/{deployment_id}/targets")
    assert source_gpu["id"] not in {t["gpu"] for t in targets["feasible"]}
    refused = [r for r in targets["infeasible"] if r["gpu"] == source_gpu["id"]]
    assert refused and "placement.cordoned" in {v["code"] for v in refused[0]["violations"]}
    status, back = stack.request("POST", f"/api/v1/hosts/{source_host}/uncordon", {})
    assert status == 200 and back["status"] == "ready", back
