"""``bench_rollout``: how long a fleet-wide MIG layout rollout takes, on the production stack.

It starts its own stack on loopback (:class:`fleet.bench.stack.Stack`: a scratch PostgreSQL
database, a private Redis, daphne; plus a Celery worker and beat, which advance rollouts and
moves) and one ``hostagent.swarm`` process of simulated agents (the real agent code on the
simulated NVML backend, applying layouts, running replicas as real processes). Then:

1. **cut**: a rollout cuts every idle GPU into seven ``1g.10gb`` instances (no replica moves:
   the figure is the layout path alone: plan, push, agent apply, verify, per wave);
2. ``--replicas`` process replicas of one ``1g.10gb`` deployment are auto-placed and run;
3. **reshape**: a rollout reshapes every GPU to four ``1g.10gb`` and one ``3g.40gb``; the
   replicas on the slices that go are moved first, make before break, to GPUs not in the wave.
   The deployment's running count is sampled every 200 ms during it (``min_running``: the goal
   is never fewer than before); ``moves_failed`` counts moves cancelled or failed (their old
   copies kept running) and ``stopped_and_replaced`` the replicas that no move could take and
   that were stopped and placed again.

Both rollouts run in waves of ``--max-unavailable`` GPUs. Reported per rollout: wall time from
the request to the operation's success, GPUs reshaped, replicas moved, and the mean time per
wave.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.bench.api import Api
from fleet.bench.options import Options
from fleet.bench.processes import terminate, wait_until
from fleet.bench.stack import ROOT, Stack

PRODUCT_KEY = "h100-sxm5-80gb"
SEVEN_1G = {"mode": "mig", "instances": [{"profile": "1g.10gb", "start": s} for s in range(7)]}
FOUR_1G_ONE_3G = {
    "mode": "mig",
    "instances": [{"profile": "1g.10gb", "start": s} for s in range(4)]
    + [{"profile": "3g.40gb", "start": 4}],
}
COMMAND = ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 86400 & wait"]


@dataclass
class RolloutOptions:
    gpus: int = 100
    gpus_per_host: int = 4
    replicas: int = 100
    max_unavailable: int = 10
    database_url: str = ""
    workdir: Path | None = None
    timeout_s: float = 900.0
    log: Any = print


def run_rollout_bench(options: RolloutOptions) -> dict[str, Any]:
    hosts = math.ceil(options.gpus / options.gpus_per_host)
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="fleet-bench-rollout-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stack = Stack(workdir, options.database_url, Options(hosts=hosts, servers=1))
    stack.env["FLEET_THROTTLE_USER"] = "1000000/min"
    swarm: subprocess.Popen[bytes] | None = None
    try:
        stack.start()
        stack.start_servers()
        stack.start_worker()
        stack.start_beat()
        token = stack.run_python(
            "manage.py", "create_api_token", "bench-admin", "--role", "admin"
        ).strip()
        api = Api(stack.urls[0], token)
        api.allow_workloads()
        run = uuid.uuid4().hex[:8]
        seeded_path = workdir / "seeded.json"
        stack.run_python(
            "-m", "fleet.bench.seed", "setup", str(hosts), str(options.gpus_per_host),
            PRODUCT_KEY, run, str(seeded_path),
        )  # fmt: skip
        seeded = json.loads(seeded_path.read_text())
        config = workdir / "swarm.json"
        config.write_text(
            json.dumps(
                {
                    "server": stack.urls[0],
                    "interval_s": 1.0,
                    "allow_mutation": True,
                    "hostname_prefix": f"bench-{run}",
                    "runtime": "process",
                    "allow_process_runtime": True,
                    "process_as_agent_user": True,
                    "state_dir": str(workdir / "workloads"),
                    "stop_workloads_on_exit": True,
                    "hosts": [{"token": h["token"], "gpus": h["gpus"]} for h in seeded["hosts"]],
                }
            )
        )
        config.chmod(0o600)
        swarm = stack.spawn("swarm", [sys.executable, "-m", "hostagent.swarm", str(config)])
        total = hosts * options.gpus_per_host
        wait_until(
            lambda: api.ok("GET", "/api/v1/hosts/?status=ready&limit=1")["count"] == hosts,
            120,
            "every simulated host ready",
        )
        options.log(f"{hosts} hosts, {total} GPUs ready")
        cut = _rollout(api, SEVEN_1G, options, None)
        options.log(f"cut: {cut['seconds']} s")
        started = time.monotonic()  # auto-placement starts within the request
        deployment = api.ok(
            "POST",
            "/api/v1/deployments/",
            {
                "name": "bench-rollout",
                "kind": "mig",
                "profile": "1g.10gb",
                "replicas": options.replicas,
                "auto": True,
                "workload": {"runtime": "process", "command": COMMAND, "stop_grace_s": 5},
            },
        )
        dep = int(deployment["id"])
        wait_until(
            lambda: _running(api, dep) == options.replicas,
            options.timeout_s,
            f"{options.replicas} replicas running",
        )
        placed_s = round(time.monotonic() - started, 2)
        options.log(f"{options.replicas} replicas running in {placed_s} s")
        reshape = _rollout(api, FOUR_1G_ONE_3G, options, dep)
        options.log(f"reshape: {reshape['seconds']} s")
        return {
            "gpus": total,
            "hosts": hosts,
            "product": PRODUCT_KEY,
            "max_unavailable": options.max_unavailable,
            "replicas": options.replicas,
            "cut_idle_gpus": cut,
            "replicas_running_s": placed_s,
            "reshape_busy_gpus": reshape,
            "running_after": _running(api, dep),
        }
    finally:
        if swarm is not None:
            terminate(swarm, 30)
        stack.stop()


def _running(api: Api, deployment_id: int) -> int:
    return int(api.ok("GET", f"/api/v1/deployments/{deployment_id}/")["running_replicas"])


def _count(api: Api, query: str) -> int:
    return int(api.ok("GET", f"/api/v1/operations/?{query}&limit=1")["count"])


def _moves(api: Api) -> int:
    return _count(api, "kind=move&status=succeeded")


def _rollout(
    api: Api, layout: dict[str, Any], options: RolloutOptions, deployment: int | None
) -> dict[str, Any]:
    body = {
        "selector": {"product": PRODUCT_KEY},
        "layout": layout,
        "max_unavailable": options.max_unavailable,
    }
    samples: list[int] = []
    stop = threading.Event()

    errors: list[str] = []

    def watch() -> None:
        while deployment is not None and not stop.is_set():
            try:
                samples.append(_running(api, deployment))
            except (OSError, RuntimeError) as error:  # a slow answer is not a stopped replica
                errors.append(f"{type(error).__name__}: {error}")
            stop.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    before = _running(api, deployment) if deployment is not None else None
    moves_before = _moves(api)
    failed_before = _count(api, "kind=move&status=failed")
    replaced_before = _count(api, "kind=replace")
    started = time.monotonic()
    watcher.start()
    op = api.ok("POST", "/api/v1/rollouts/", body)
    final: dict[str, Any] = {}

    def done() -> bool:
        nonlocal final
        try:
            final = api.ok("GET", f"/api/v1/operations/{op['id']}/")
        except OSError as error:
            errors.append(f"{type(error).__name__}: {error}")
            return False
        if final["status"] in {"failed", "cancelled", "expired"}:
            raise RuntimeError(f"rollout {final['status']}: {final.get('reason')}")
        return bool(final["status"] == "succeeded" and not final["payload"].get("paused"))

    try:
        wait_until(done, options.timeout_s, "the rollout")
    finally:
        stop.set()
        watcher.join()
    seconds = time.monotonic() - started
    payload = final.get("payload") or {}
    gpus = len(payload.get("done") or [])
    # At most max_unavailable GPUs drain at once (a sliding window, not lock-step waves).
    waves = math.ceil(gpus / options.max_unavailable) if gpus else 0
    return {
        "seconds": round(seconds, 2),
        "gpus": gpus,
        "waves": waves,
        "seconds_per_wave": round(seconds / waves, 2) if waves else None,
        "replicas_moved": _moves(api) - moves_before,
        # Moves cancelled or failed (the old copy kept running), and replicas stopped and
        # placed again because no move could take them (make before break not kept).
        "moves_failed": _count(api, "kind=move&status=failed") - failed_before,
        "stopped_and_replaced": _count(api, "kind=replace") - replaced_before,
        "running_before": before,
        "min_running": min(samples) if samples else None,
        "samples": len(samples),
        "api_errors": len(errors),
        "result": final.get("result"),
    }


__all__ = ["ROOT", "RolloutOptions", "run_rollout_bench"]
