"""Reclaim, end to end with real processes: daphne, a Celery worker and beat (which starts the
reclaims) on Redis, PostgreSQL, and a ``fleet-agent`` running the replicas as real processes on
simulated MIG slices of two H100s.

*search* (a limit, no deserved share) borrows a 1g.10gb slice; *ads* (a deserved share) claims
a 4g.40gb that fits only once that replica moves: beat's reclaim moves it, make before break,
with no moment when search runs fewer replicas (the serving gap is 0 ms at a 50 ms sampling).
Then, with no room left anywhere to move it, ads's next claim stops it: it drains, exits and
waits in the queue again (not deleted), and ads's replica takes its place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import Stack, Watch, launched, running, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

SAMPLE_MS = 50  # Watch's sampling period


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    env = {"FLEET_RECLAIM_MIN_RUNTIME_S": "0", "FLEET_RECLAIM_EVERY_S": "1"}
    with launched(tmp_path_factory.mktemp("stack"), env=env) as up:
        yield up


def team(stack: Stack, name: str, quota: dict[str, Any]) -> int:
    stack.allow_workloads(team=name)
    teams = stack.get("/api/v1/teams/?limit=1000", token="admin")["results"]
    team_id = int(next(t["id"] for t in teams if t["slug"] == name))
    status, body = stack.request("PUT", f"/api/v1/teams/{team_id}/quota", quota, token="admin")
    assert status == 200, body
    return team_id


def sleeper(out: Path) -> dict[str, Any]:
    return {
        "runtime": "process",
        "command": ["/bin/sh", "-c", "exec sleep 3600"],
        "env": {"OUT": str(out)},
        "stop_grace_s": 2,
    }


def deploy(stack: Stack, name: str, team_id: int, profile: str, out: Path, auto: bool) -> int:
    body = {
        "name": name,
        "replicas": 1,
        "kind": "mig",
        "profile": profile,
        "team": team_id,
        "auto": auto,
        "workload": sleeper(out),
    }
    status, created = stack.request("POST", "/api/v1/deployments/", body)
    assert status == 201, created
    return int(created["id"])


def allocations(stack: Stack, deployment_id: int) -> list[dict[str, Any]]:
    return list(stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"])


def reclaim_of(stack: Stack, deployment_id: int) -> dict[str, Any] | None:
    rows = stack.get(f"/api/v1/operations/?kind=reclaim&deployment={deployment_id}")["results"]
    return dict(rows[0]) if rows else None


def finished(stack: Stack, deployment_id: int) -> dict[str, Any]:
    """The deployment's reclaim once it ended (its log on a timeout)."""
    op_id = int(reclaim_of(stack, deployment_id)["id"])
    try:
        return stack.wait_operation(op_id, timeout=90)
    except AssertionError as error:
        raise AssertionError(f"{error}: {stack.get(f'/api/v1/operations/{op_id}/')}") from None


def test_a_reclaim_moves_without_a_gap_then_stops_only_when_no_room_is_left(stack, tmp_path):
    agent = stack.add_agent("rc-1", ["h100-sxm5-80gb"] * 2, runtime="process")
    x, y = stack.gpus(agent)
    layouts = {x["id"]: "1g.10gb", y["id"]: "3g.40gb"}
    for gpu_id, profile in layouts.items():
        body = {"mode": "mig", "instances": [{"profile": profile, "start": 0}]}
        status, op = stack.request("PUT", f"/api/v1/gpus/{gpu_id}/layout", body)
        assert status == 202, op
        assert stack.wait_operation(op["id"])["status"] == "succeeded"
    for gpu_id in layouts:
        wait_until(lambda g=gpu_id: stack.converged(g), 20, what="the MIG layouts")
    search = team(stack, "search", {"limit": {"mig_compute_slices": 14}})
    ads = team(stack, "ads", {"mig_compute_slices": 14})
    # ads holds a 3g at the start of y (its own share); search borrows a 1g at the start of x.
    base = deploy(stack, "ads-base", ads, "3g.40gb", tmp_path, auto=True)
    small = deploy(stack, "search-small", search, "1g.10gb", tmp_path, auto=True)
    (lent,) = allocations(stack, small)
    assert lent["borrowed"] and lent["gpu"] == x["id"], lent
    wait_until(lambda: running(stack, small) == 1 and running(stack, base) == 1, 30, what="run")

    # 1. ads claims a 4g.40gb: it fits only at the start of x, once search's 1g moves to y.
    with Watch(stack, small) as watch:
        big = deploy(stack, "ads-big", ads, "4g.40gb", tmp_path, auto=False)
        wait_until(lambda: reclaim_of(stack, big) is not None, 20, what="beat starts a reclaim")
        moved = finished(stack, big)
        wait_until(lambda: len(allocations(stack, small)) == 1, 20, what="the old copy exits")
    assert moved["status"] == "succeeded", moved
    payload = moved["payload"]
    assert payload["action"] == "move" and payload["stopped"] == [], payload
    assert payload["lender"]["name"] == "ads" and payload["borrowers"][0]["name"] == "search"
    assert "no smaller set" in payload["bound"]
    (copy,) = allocations(stack, small)
    assert copy["gpu"] == y["id"] and copy["borrowed"] and copy["workload_state"] == "running"
    (placed,) = allocations(stack, big)
    assert placed["gpu"] == x["id"]
    gap_ms = SAMPLE_MS * sum(1 for n in watch.samples if n < 1)
    assert gap_ms == 0 and len(watch.samples) > 10, watch.samples

    # 2. ads fills x (its 3 free slices); then claims another 3g.40gb: only y's back half could
    # take it, where search's 1g runs, and there is no room left to move it: it is stopped.
    fill = deploy(stack, "ads-fill", ads, "3g.40gb", tmp_path, auto=True)
    assert allocations(stack, fill)[0]["gpu"] == x["id"]
    last = deploy(stack, "ads-last", ads, "3g.40gb", tmp_path, auto=False)
    wait_until(lambda: reclaim_of(stack, last) is not None, 20, what="beat starts a reclaim")
    stopped = finished(stack, last)
    assert stopped["status"] == "succeeded", stopped
    payload = stopped["payload"]
    assert payload["action"] == "stop", payload
    assert [s["allocation"] for s in payload["stopped"]] == [copy["id"]]
    assert "no plan of at most 3 moves" in payload["bound"]
    assert payload["claims"] == [{"deployment": small, "gpus": [y["id"]]}]
    (claimed,) = allocations(stack, last)
    assert claimed["gpu"] == y["id"]
    # The stopped replica waits in the queue again: its deployment is there, nothing placed.
    assert allocations(stack, small) == []
    assert stack.get(f"/api/v1/deployments/{small}/")["replicas"] == 1
    queue = stack.get("/api/v1/queue/")["waiting"]
    assert any(e["deployment"] == small for e in queue), queue
    evicts = stack.get(f"/api/v1/operations/?kind=evict&deployment={small}")["results"]
    assert len(evicts) == 1
    wait_until(lambda: running(stack, last) == 1, 30, what="the claimant runs")


def test_a_replica_created_into_the_queue_is_placed_once_capacity_frees(stack, tmp_path):
    """``wait``: a whole-GPU replica that fits nowhere is created waiting (201, not 422); when
    the replica holding the GPU is deleted and its process has exited, the queue places the
    waiting one without anyone asking (the agent's report kicks ``fleet.place_queue`` on the
    worker; beat's run is the backstop) and the agent starts it."""
    agent = stack.add_agent("qp-1", ["h100-sxm5-80gb"], runtime="process")
    (gpu,) = stack.gpus(agent)
    status, op = stack.request("PUT", f"/api/v1/gpus/{gpu['id']}/layout", {"mode": "dedicated"})
    assert status in (200, 202), op  # 200: it already was
    assert stack.wait_operation(op["id"])["status"] == "succeeded"
    owner = team(stack, "queue-demo", {"gpus": 1})

    def whole(name: str, **extra: Any) -> dict[str, Any]:
        body = {"name": name, "replicas": 1, "kind": "gpu", "gpu_count": 1, "team": owner}
        status, created = stack.request(
            "POST", "/api/v1/deployments/", {**body, "workload": sleeper(tmp_path), **extra}
        )
        assert status == 201, created
        return dict(created)

    first = whole("holder", auto=True)
    assert first["placed_replicas"] == 1
    wait_until(lambda: running(stack, first["id"]) == 1, 30, what="the holder runs")
    second = whole("waiter", wait=True)
    assert second["placed_replicas"] == 0  # waits: the GPU is taken (and the team's share)
    queue = stack.get("/api/v1/queue/")["waiting"]
    assert any(e["deployment"] == second["id"] for e in queue), queue

    status, body = stack.request("DELETE", f"/api/v1/deployments/{first['id']}/")
    assert status in (202, 204), body
    wait_until(lambda: allocations(stack, first["id"]) == [], 30, what="the holder's exit")
    wait_until(
        lambda: len(allocations(stack, second["id"])) == 1, 15, what="the queue places the waiter"
    )
    (placed,) = allocations(stack, second["id"])
    assert placed["gpu"] == gpu["id"], placed
    wait_until(lambda: running(stack, second["id"]) == 1, 30, what="the waiter runs")
    operations = stack.get(f"/api/v1/operations/?kind=place&deployment={second['id']}")
    assert operations["count"] == 1, operations


def test_an_operators_reclaim_and_beats_sweep_start_one_between_them(stack, tmp_path):
    """What-would-it-take's stop plan (``POST /queue/reclaim/{id}``, the API's process) sent
    as the claimant is created, while beat's sweep (the worker's process, every second) starts
    reclaims too: the advisory lock serialises them, so exactly one reclaim runs for the
    claimant (the other answers 409 ``reclaim.in_progress``, or the API's came first), one
    borrowed replica is stopped, and the claimant is placed on its GPU."""
    agent = stack.add_agent("rc-2", ["h100-sxm5-80gb"] * 2, runtime="process")
    for gpu in stack.gpus(agent):
        status, op = stack.request("PUT", f"/api/v1/gpus/{gpu['id']}/layout", {"mode": "dedicated"})
        assert status in (200, 202), op
        assert stack.wait_operation(op["id"])["status"] == "succeeded"
    lender = team(stack, "race-lender", {"gpus": 1})
    borrower = team(stack, "race-borrower", {"limit": {"gpus": 2}})

    def whole(name: str, team_id: int, replicas: int, **extra: Any) -> int:
        body = {"name": name, "replicas": replicas, "kind": "gpu", "gpu_count": 1}
        body.update(team=team_id, workload=sleeper(tmp_path), **extra)
        status, created = stack.request("POST", "/api/v1/deployments/", body)
        assert status == 201, created
        return int(created["id"])

    held = whole("race-held", borrower, 2, auto=True)
    wait_until(lambda: running(stack, held) == 2, 30, what="both borrowed replicas run")
    assert all(a["borrowed"] for a in allocations(stack, held))
    claimant = whole("race-claimant", lender, 1, wait=True)
    status, body = stack.request("POST", f"/api/v1/queue/reclaim/{claimant}", None)
    assert status == 202 or (status == 409 and body["code"] == "reclaim.in_progress"), body
    done = finished(stack, claimant)
    assert done["status"] == "succeeded", done
    reclaims = stack.get(f"/api/v1/operations/?kind=reclaim&deployment={claimant}")
    assert reclaims["count"] == 1, reclaims  # one between the operator and beat
    (stopped,) = done["payload"]["stopped"]
    (placed,) = allocations(stack, claimant)
    assert placed["gpu"] == stopped["gpu"] and not placed["borrowed"], (placed, stopped)
    assert len([a for a in allocations(stack, held) if a["state"] != "releasing"]) == 1
    evicts = stack.get(f"/api/v1/operations/?kind=evict&deployment={held}")
    assert evicts["count"] == 1, evicts
