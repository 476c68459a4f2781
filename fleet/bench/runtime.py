"""``bench_runtime``: how fast the agent runs workloads, on the production stack.

It starts its own stack on loopback (a scratch PostgreSQL database, a private Redis, daphne, a
Celery worker), one real ``fleet-agent`` on the simulated backend with a real runtime (Docker by
default, with a locally built image: no registry is needed), and MIG GPUs cut into 1g slices.
Then, for a deployment of N container replicas:

* **place → running**: each replica is placed alone through the API; the time until the API shows
  its workload ``running`` (the agent applied the desired state, started the container and
  reported it);
* **burst**: N replicas placed at once; replicas started per second until all run;
* **adoption**: the agent is killed with SIGKILL and started again; the time until it reported
  every replica running again, with the same containers (none restarted or duplicated). The
  replicas' state is reset to ``pending`` in the database while the agent is down, so the figure
  is the time until the control plane knows again, not a stale ``running``;
* **evict → free**: each replica evicted alone; the time until its slice is free (its row is
  gone: the agent stopped the workload and said so);
* **moves**: each replica (up to :data:`MAX_MOVES`) moved to a free slice, make before break,
  while the deployment's running count is sampled: the time from the request to the move's
  success, and the **gap**, the time during which fewer replicas ran than before the move
  (0 ms is the goal: the old copy stops only once the new one runs).

The API is polled every 50 ms (the figures' resolution). The user API rate limit is raised for
the bench's token so that polling is not throttled.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.bench.image import ensure_image
from fleet.bench.options import Options
from fleet.bench.processes import terminate, wait_until
from fleet.bench.stack import BIN, Stack

SLICES_PER_GPU = 7
MAX_MOVES = 20
POLL_S = 0.05
HOST = "bench-runtime"
# Exits at once on SIGTERM (a shell as PID 1 ignores it otherwise, and the stop would last the
# whole grace): the figure is the agent's work, not a grace period.
COMMAND = ["sh", "-c", "trap 'exit 0' TERM; sleep 86400 & wait"]


@dataclass
class RuntimeOptions:
    replicas: int = 20
    runtime: str = "docker"
    image: str = "fleet-test/busybox:2"
    database_url: str = ""
    workdir: Path | None = None
    timeout_s: float = 120.0
    log: Any = print


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]

    return {
        "p50": round(statistics.median(ordered) * 1000, 1),
        "p99": round(at(0.99) * 1000, 1),
        "max": round(ordered[-1] * 1000, 1),
    }


class Api:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Content-Type": "application/json", "Authorization": f"Token {self.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.call(method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {answer}")
        return answer

    def allow_workloads(self, team: str = "default") -> None:
        """The bench's team may run what the benches run (processes and containers, as the
        bench's own non-root user, or ``nobody`` when it runs as root), as an admin's policy
        would allow: the restricted default refuses processes."""
        found = self.ok("GET", "/api/v1/teams/?limit=1000")["results"]
        team_id = next(t["id"] for t in found if t["slug"] == team)
        uid, gid = os.getuid(), os.getgid()
        user = f"{uid}:{gid}" if uid != 0 else "65534:65534"
        self.ok(
            "PUT",
            f"/api/v1/teams/{team_id}/policy",
            {
                "runtimes": ["container", "process"],
                "process_user": user,
                "uids": [[1, 2_147_483_647]],
                "host_network": True,
            },
        )

    def allocations(self, deployment_id: int) -> list[dict[str, Any]]:
        return list(
            self.ok("GET", f"/api/v1/allocations/?deployment={deployment_id}&limit=1000")["results"]
        )


def run_runtime_bench(options: RuntimeOptions) -> dict[str, Any]:
    if options.runtime == "docker":
        ensure_image(options.image)
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="fleet-bench-runtime-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stack = Stack(workdir, options.database_url, Options(hosts=1, servers=1))
    stack.env["FLEET_THROTTLE_USER"] = "1000000/min"
    agent: subprocess.Popen[bytes] | None = None
    try:
        stack.start()
        stack.start_servers()
        stack.spawn(
            "worker", [str(BIN / "celery"), "-A", "fleet", "worker", "--pool=solo", "-l", "warning"]
        )
        token = stack.run_python(
            "manage.py", "create_api_token", "bench-admin", "--role", "admin"
        ).strip()
        api = Api(stack.urls[0], token)
        api.allow_workloads()
        # One GPU more than the replicas need: room to move them.
        gpus = max(1, math.ceil(options.replicas / SLICES_PER_GPU)) + 1
        host = api.ok("POST", "/api/v1/hosts/", {"name": HOST})
        agent_dir = workdir / "agent"
        spec = _spec(gpus)
        (agent_dir).mkdir(exist_ok=True)
        (agent_dir / "gpus.json").write_text(json.dumps({"seed": 7, "gpus": spec}))

        def start_agent(enroll: str | None) -> subprocess.Popen[bytes]:
            args = [
                str(BIN / "fleet-agent"),
                "--server", stack.urls[0],
                "--token-file", str(agent_dir / "token.json"),
                "--simulate", str(agent_dir / "gpus.json"),
                "--allow-mutation",
                "--runtime", options.runtime,
                "--state-dir", str(agent_dir / "workloads"),
                # The bench's processes run as its user; its image is built locally.
                "--allow-process-runtime", "--process-as-agent-user",
                "--image-pull", "if-not-present",
                "--mps-dir", str(agent_dir / "mps"),
                "--hostname", HOST,
            ]  # fmt: skip
            if enroll:
                args += ["--enroll", enroll]
            return stack.spawn(f"agent-{uuid.uuid4().hex[:4]}", args)

        agent = start_agent(host["enrollment_token"])
        found = wait_until(
            lambda: api.ok("GET", f"/api/v1/gpus/?host={host['id']}&limit=100")["count"] == gpus,
            60,
            "the agent's GPUs",
        )
        del found
        gpu_rows = api.ok("GET", f"/api/v1/gpus/?host={host['id']}&limit=100")["results"]
        for gpu in gpu_rows:
            op = api.ok(
                "PUT",
                f"/api/v1/gpus/{gpu['id']}/layout",
                {
                    "mode": "mig",
                    "instances": [{"profile": "1g.10gb", "start": s} for s in range(7)],
                },
            )
            _wait_operation(api, op["id"], options.timeout_s)
        options.log(f"{gpus} GPUs cut into {gpus * 7} slices; {options.replicas} replicas")
        workload = {
            "runtime": "container" if options.runtime == "docker" else "process",
            "command": COMMAND if options.runtime == "docker" else ["/bin/sh", *COMMAND[1:]],
            "stop_grace_s": 10,
        }
        if options.runtime == "docker":
            workload["image"] = options.image
            workload["user"] = "65534:65534"  # non-root, as the restricted profile wants
        deployment = api.ok(
            "POST",
            "/api/v1/deployments/",
            {
                "name": "bench",
                "kind": "mig",
                "profile": "1g.10gb",
                "replicas": options.replicas,
                "workload": workload,
            },
        )
        dep = int(deployment["id"])

        place_s = _one_by_one_place(api, dep, options)
        moves = _moves(api, dep, options)
        evict_s = _one_by_one_evict(api, dep, options)
        burst = _burst(api, workload, options)
        together = int(burst.pop("deployment"))
        adoption = _adoption(api, stack, together, options, agent, lambda: start_agent(None))
        agent = adoption.pop("agent")
        evict_all = _evict_all(api, together, options)
        result = {
            "replicas": options.replicas,
            "runtime": options.runtime,
            "image": options.image if options.runtime == "docker" else None,
            "gpus": gpus,
            "place_to_running_ms": percentiles(place_s),
            "evict_to_free_ms": percentiles(evict_s),
            "moves": moves,
            "burst": burst,
            "adoption": adoption,
            "evict_all_s": evict_all,
            "poll_interval_ms": POLL_S * 1000,
            "goal": {
                "place_to_running_p99_under_2s": bool(place_s)
                and sorted(place_s)[min(len(place_s) - 1, math.ceil(0.99 * len(place_s)) - 1)] < 2,
                "adoption_of_100_within_5s": adoption["seconds"] is not None
                and adoption["seconds"] <= 5.0 * max(1.0, options.replicas / 100),
                "move_gap_0_ms": moves["gap_ms"] == 0,
            },
        }
        return result
    finally:
        if agent is not None:
            terminate(agent, 10)
        _remove_containers()
        stack.stop()


def _spec(gpus: int) -> list[dict[str, Any]]:
    from fleet.inventory.simulation import simulated_spec
    from fleet.mig import product_by_key

    product = product_by_key("h100-sxm5-80gb")
    assert product is not None
    return [dict(simulated_spec(product)) for _ in range(gpus)]


def _wait_operation(api: Api, op_id: int, timeout: float) -> None:
    def done() -> bool:
        status = api.ok("GET", f"/api/v1/operations/{op_id}/")["status"]
        if status == "failed":
            raise RuntimeError(f"operation {op_id} failed")
        return bool(status == "succeeded")

    wait_until(done, timeout, f"operation {op_id}")


def _free_slices(api: Api) -> list[int]:
    rows = api.ok("GET", "/api/v1/partitions/?kind=mig&free=true&limit=1000")["results"]
    return [int(p["id"]) for p in rows]


def _one_by_one_place(api: Api, dep: int, options: RuntimeOptions) -> list[float]:
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


def _moves(api: Api, dep: int, options: RuntimeOptions) -> dict[str, Any]:
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


def _one_by_one_evict(api: Api, dep: int, options: RuntimeOptions) -> list[float]:
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


def _burst(api: Api, workload: dict[str, Any], options: RuntimeOptions) -> dict[str, Any]:
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


def _adoption(
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


def _evict_all(api: Api, dep: int, options: RuntimeOptions) -> float:
    started = time.monotonic()
    api.ok("POST", f"/api/v1/deployments/{dep}/evict", {})
    wait_until(
        lambda: api.allocations(dep) == [], options.timeout_s, "all slices free", every=POLL_S
    )
    return round(time.monotonic() - started, 2)


def _remove_containers() -> None:
    if shutil.which("docker") is None:
        return
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=fleet.host={HOST}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run: python manage.py bench_runtime")
