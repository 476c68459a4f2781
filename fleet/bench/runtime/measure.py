"""The phases the runtime bench measures, each against the API of a running stack with one agent:
place -> running one by one, moves (with the gap in running replicas), evict -> free, a burst,
adoption after the agent is killed, and evicting everything."""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any

from fleet.bench.api import Api
from fleet.bench.processes import wait_until
from fleet.bench.runtime.options import HOST, MAX_MOVES, POLL_S, RuntimeOptions, percentiles
from fleet.bench.stack import Stack


def _free_slices(api: Api) -> list[int]:
    rows = api.ok("GET", "/api/v1/partitions/?kind=mig&free=true&limit=1000")["results"]
    return [int(p["id"]) for p in rows]


def one_by_one_place(api: Api, dep: int, options: RuntimeOptions) -> list[float]:
    took = []
    for _ in range(options.replicas):
        slice_id = _free_slices(api)[0]
        started = time.monotonic()
        api.ok("POST", f"/api/v1/deployments/{dep}/place", {"partition": slice_id})
        placed = {a["id"] for a in api.allocations(dep)}

        def running(placed: set[int] = placed) -> bool:
            rows = api.allocations(dep)
            return all(a["workload_state"] == "running" for a in rows if a["id"] in placed)

        wait_until(running, options.timeout_s, "a placed replica running", every=POLL_S)
        took.append(time.monotonic() - started)
    return took


def moves(api: Api, dep: int, options: RuntimeOptions) -> dict[str, Any]:
    """Move replicas one at a time to a free slice on another GPU, sampling the deployment's
    running count every :data:`POLL_S`; the gap sums the sampled intervals below the count
    before the moves."""
    before = int(api.ok("GET", f"/api/v1/deployments/{dep}/")["running_replicas"])
    took: list[float] = []
    gap_s = 0.0
    lowest = before
    for row in api.allocations(dep)[:MAX_MOVES]:
        gpu_of = {int(p["id"]): int(p["gpu"]) for p in _free_partitions(api)}
        target = next((pid for pid, gpu in gpu_of.items() if gpu != row["gpu"]), None)
        if target is None:
            break
        started = time.monotonic()
        op = api.ok("POST", f"/api/v1/allocations/{row['id']}/move", {"partition": target})
        last = started
        while True:
            now_running = int(api.ok("GET", f"/api/v1/deployments/{dep}/")["running_replicas"])
            now = time.monotonic()
            if now_running < before:
                gap_s += now - last
            lowest = min(lowest, now_running)
            last = now
            status = api.ok("GET", f"/api/v1/operations/{op['id']}/")["status"]
            if status in ("failed", "expired"):
                raise RuntimeError(f"move {op['id']} {status}")
            if status == "succeeded" and len(api.allocations(dep)) == options.replicas:
                break  # the new copy runs and the old one has stopped
            if now - started > options.timeout_s:
                raise RuntimeError(f"move {op['id']} did not finish")
            time.sleep(POLL_S)
        took.append(time.monotonic() - started)
    return {
        "moves": len(took),
        "move_ms": percentiles(took),
        "gap_ms": round(gap_s * 1000, 1),
        "running_before": before,
        "lowest_running_seen": lowest,
    }


def _free_partitions(api: Api) -> list[dict[str, Any]]:
    return list(api.ok("GET", "/api/v1/partitions/?kind=mig&free=true&limit=1000")["results"])


def one_by_one_evict(api: Api, dep: int, options: RuntimeOptions) -> list[float]:
    took = []
    for replica in range(options.replicas):
        started = time.monotonic()
        api.ok("POST", f"/api/v1/deployments/{dep}/evict", {"replica": replica})
        wait_until(
            lambda r=replica: all(a["replica"] != r for a in api.allocations(dep)),  # type: ignore[misc]
            options.timeout_s,
            "an evicted replica's slice free",
            every=POLL_S,
        )
        took.append(time.monotonic() - started)
    return took


def burst(api: Api, workload: dict[str, Any], options: RuntimeOptions) -> dict[str, Any]:
    """A deployment of N replicas created with ``auto``: the engine places them all in the
    request, the agent starts them together."""
    started = time.monotonic()
    created = api.ok(
        "POST",
        "/api/v1/deployments/",
        {
            "name": "bench-burst",
            "kind": "mig",
            "profile": "1g.10gb",
            "replicas": options.replicas,
            "workload": workload,
            "auto": True,
        },
    )
    dep = int(created["id"])
    wait_until(
        lambda: (
            sum(a["workload_state"] == "running" for a in api.allocations(dep)) == options.replicas
        ),
        options.timeout_s,
        "every replica running",
        every=POLL_S,
    )
    seconds = time.monotonic() - started
    return {
        "deployment": dep,
        "seconds": round(seconds, 2),
        "starts_per_s": round(options.replicas / seconds, 1),
    }


def _containers() -> dict[str, str]:
    """``{allocation id: container id}`` of the bench host's running containers."""
    if shutil.which("docker") is None:
        return {}
    out = subprocess.run(
        [
            "docker",
            "ps",
            "--filter",
            f"label=fleet.host={HOST}",
            "--format",
            '{{.ID}} {{.Label "fleet.allocation"}}',
        ],
        capture_output=True,
        text=True,
    ).stdout
    return {alloc: cid for cid, alloc in (line.split() for line in out.splitlines() if " " in line)}


def adoption(
    api: Api,
    stack: Stack,
    dep: int,
    options: RuntimeOptions,
    agent: subprocess.Popen[bytes],
    restart: Any,
) -> dict[str, Any]:
    before = {a["id"]: (a["restarts"], a["started_at"]) for a in api.allocations(dep)}
    containers = _containers()
    agent.kill()
    agent.wait(10)
    _reset_states(stack, list(before))
    started = time.monotonic()
    new_agent = restart()
    seconds: float | None
    try:
        wait_until(
            lambda: (
                sum(a["workload_state"] == "running" for a in api.allocations(dep)) == len(before)
            ),
            options.timeout_s,
            "every replica reported running again",
            every=POLL_S,
        )
        seconds = time.monotonic() - started
    except AssertionError:
        seconds = None
    after = {a["id"]: (a["restarts"], a["started_at"]) for a in api.allocations(dep)}
    return {
        "agent": new_agent,
        "replicas": len(before),
        "seconds": round(seconds, 2) if seconds is not None else None,
        "adopted_per_s": round(len(before) / seconds, 1) if seconds else None,
        "same_containers": _containers() == containers if options.runtime == "docker" else None,
        "restarts_unchanged": after == before,
    }


def _reset_states(stack: Stack, allocation_ids: list[int]) -> None:
    import psycopg

    with psycopg.connect(f"{stack.server_url}/{stack.db_name}", autocommit=True) as conn:
        conn.execute(
            "UPDATE allocations_allocation SET workload_state = 'pending' WHERE id = ANY(%s)",
            [allocation_ids],
        )


def evict_all(api: Api, dep: int, options: RuntimeOptions) -> float:
    started = time.monotonic()
    api.ok("POST", f"/api/v1/deployments/{dep}/evict", {})
    wait_until(
        lambda: api.allocations(dep) == [], options.timeout_s, "all slices free", every=POLL_S
    )
    return round(time.monotonic() - started, 2)
