"""The runtime bench's run: its own stack on loopback, one real agent on MIG GPUs cut into 1g
slices, a deployment of N container replicas, then each phase (:mod:`.measure`) in turn; the
figures as JSON."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from fleet.bench.api import Api
from fleet.bench.image import ensure_image
from fleet.bench.options import Options
from fleet.bench.processes import terminate, wait_until
from fleet.bench.runtime import measure
from fleet.bench.runtime.options import (
    COMMAND,
    HOST,
    POLL_S,
    SLICES_PER_GPU,
    RuntimeOptions,
    percentiles,
)
from fleet.bench.stack import BIN, Stack


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
        stack.start_worker()
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

        place_s = measure.one_by_one_place(api, dep, options)
        moves = measure.moves(api, dep, options)
        evict_s = measure.one_by_one_evict(api, dep, options)
        burst = measure.burst(api, workload, options)
        together = int(burst.pop("deployment"))
        adoption = measure.adoption(api, stack, together, options, agent, lambda: start_agent(None))
        agent = adoption.pop("agent")
        evict_all = measure.evict_all(api, together, options)
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
