"""``bench_endpoints``: zero failed requests through an endpoint while its replicas move, roll out,
drain and crash, on the production stack and the real balancer.

It starts its own stack on loopback (:class:`fleet.bench.stack.Stack`: a scratch PostgreSQL
database, a private Redis, daphne, a Celery worker and beat), one ``hostagent.swarm`` process per
host (the real agent code on simulated GPUs, running replicas as real processes, reached at
127.0.0.1), and ``manage.py fleet_gateway`` (HAProxy driven over its Runtime API). A deployment of
``--replicas`` copies of :mod:`fleet.bench.token_server` (service time: 1 ms per 10 tokens) gets
the endpoint ``/bench``. With ``runtime="docker"`` the copies are containers on the local Docker
Engine instead, of the tests' busybox image (:mod:`fleet.bench.image`): busybox's ``httpd`` with
a CGI script that keeps the same service time (:func:`container_workload`). Then:

1. **direct**: the trace's arrivals (:mod:`fleet.bench.replay`, compressed to ``--seconds``) are
   sent straight to the copies' host ports, round-robin: the baseline;
2. **through the gateway**: the same arrivals are sent to the gateway while
   :mod:`fleet.bench.endpoint_changes` moves every copy, rolls out a new version, drains a host,
   SIGKILLs an agent (restarted after ``agent_down_s``) and SIGKILLs a copy's process.
   :mod:`fleet.bench.gateway_watch` records Fleet's and HAProxy's view of each server meanwhile.

Reported: requests, failures (per change; those in flight on the killed copy), latency through
the gateway and direct, the gateway's overhead, and the update lag (Fleet → HAProxy).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.bench import endpoint_report
from fleet.bench.api import Api
from fleet.bench.endpoint_changes import KINDS, Scenario, kill_container
from fleet.bench.image import ensure_image
from fleet.bench.options import Options
from fleet.bench.processes import free_port, terminate, wait_until
from fleet.bench.replay import TRACE, load_trace, replay
from fleet.bench.stack import ROOT, Stack

PRODUCT_KEY = "h100-sxm5-80gb"
SERVER = Path(__file__).resolve().with_name("token_server.py")
# The copies run as the team's process user (``nobody`` when the bench runs as root): the
# system's Python runs the server (standard library only), not the virtual environment's.
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
PATH_PREFIX = "/bench"


@dataclass
class EndpointOptions:
    seconds: float = 120.0
    requests: int | None = None  # the trace's first N requests (None: all of them)
    replicas: int = 4
    hosts: int = 3
    gpus_per_host: int = 4
    changes: tuple[str, ...] = KINDS
    agent_down_s: float = 5.0
    lead_in_s: float = 5.0  # replay before the first change
    trace: Path = TRACE
    database_url: str = ""
    workdir: Path | None = None
    timeout_s: float = 120.0
    runtime: str = "process"  # or "docker"
    log: Any = print


def workload(version: int) -> dict[str, Any]:
    return {
        "runtime": "process",
        "command": [PYTHON, "-I", str(SERVER)],
        "env": {"VERSION": str(version)},
        "ports": [{"name": "http", "port": 8000}],
        "health": {"http": {"port": 8000, "path": "/health"}, "interval_s": 1, "timeout_s": 1},
        "stop_grace_s": 10,
    }


IMAGE = "fleet-test/busybox:2"
"""The Docker mode's image: the one the Docker tests build (:mod:`fleet.bench.image`)."""

# busybox's httpd serves /health as a file and /cgi-bin/generate as a CGI script with the token
# server's service time (1 ms per 10 tokens, at most 30 s; digits only, else 400). busybox's
# httpd closes each connection after its answer, and stops at once on SIGTERM: the endpoint's
# drain, before the agent stops a copy, is what keeps its callers from seeing that.
CGI = r"""#!/bin/sh
q="&$QUERY_STRING&"
c=${q#*&context=}; c=${c%%&*}
g=${q#*&generated=}; g=${g%%&*}
case "$c$g" in *[!0-9]*|'') printf 'Status: 400 Bad Request\r\n\r\n'; exit 0;; esac
us=$(( (c + g) * 100 ))
[ "$us" -gt 30000000 ] && us=30000000
usleep "$us"
printf 'Content-Type: application/json\r\nX-Service-Ms: %s\r\n\r\n' "$((us / 1000))"
printf '{"version": "%s"}\n' "$VERSION"
"""


def container_workload(version: int) -> dict[str, Any]:
    """The Docker mode's copy: busybox httpd in a container, as a user of no account."""
    script = (
        "mkdir -p /tmp/www/cgi-bin && echo ok > /tmp/www/health && "
        "cat > /tmp/www/cgi-bin/generate <<'EOF'\n" + CGI + "EOF\n"
        "chmod 755 /tmp/www/cgi-bin/generate && exec httpd -f -p 8000 -h /tmp/www"
    )
    return {
        "runtime": "container",
        "image": IMAGE,
        "user": "65534:65534",
        "command": ["sh", "-c", script],
        "env": {"VERSION": str(version)},
        "ports": [{"name": "http", "port": 8000}],
        "health": {"http": {"port": 8000, "path": "/health"}, "interval_s": 1, "timeout_s": 1},
        "stop_grace_s": 10,
    }


def generate_path(runtime: str) -> str:
    """Where a copy serves ``/generate`` (busybox's httpd runs CGI scripts under /cgi-bin)."""
    return "/cgi-bin/generate" if runtime == "docker" else "/generate"


class Agents:
    """One swarm process per host, so that one agent can be SIGKILLed and started again."""

    def __init__(
        self,
        stack: Stack,
        workdir: Path,
        seeded: dict[str, Any],
        run: str,
        runtime: str = "process",
    ) -> None:
        self.stack = stack
        self.hostname_prefix = f"bench-{run}-"  # every host's name starts so: this run's
        self.configs: dict[int, Path] = {}
        for n, host in enumerate(seeded["hosts"]):
            config = workdir / f"agent-{n}.json"
            config.write_text(
                json.dumps(
                    {
                        "server": stack.urls[0],
                        "interval_s": 1.0,
                        "allow_mutation": True,
                        "hostname_prefix": f"{self.hostname_prefix}h{n}",
                        "runtime": runtime,
                        "allow_process_runtime": runtime == "process",
                        "process_as_agent_user": runtime == "process",
                        "state_dir": str(workdir / "workloads" / str(n)),
                        "stop_workloads_on_exit": True,
                        "address": "127.0.0.1",
                        "hosts": [{"token": host["token"], "gpus": host["gpus"]}],
                    }
                )
            )
            config.chmod(0o600)
            self.configs[int(host["host_id"])] = config
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, host: int) -> None:
        self.processes[host] = self.stack.spawn(
            f"agent-{host}", [sys.executable, "-m", "hostagent.swarm", str(self.configs[host])]
        )

    def kill(self, host: int) -> None:
        """SIGKILL: the agent dies, its replicas (their own sessions) keep running."""
        process = self.processes.pop(host)
        process.kill()
        process.wait(10)

    def stop(self) -> None:
        for process in self.processes.values():
            terminate(process, 30)  # SIGTERM: the agents stop their replicas on the way out
        self.processes.clear()


def seeded_fleet(
    stack: Stack, workdir: Path, hosts: int, gpus_per_host: int, runtime: str = "process"
) -> tuple[Api, Agents]:
    """Start ``stack`` (its servers, a worker, beat), an admin's API with workloads allowed, and
    ``hosts`` simulated hosts of ``gpus_per_host`` GPUs seeded and reporting ready: what
    ``bench_endpoints`` and ``bench_autoscale`` both stand on. Stops the agents it started when
    the hosts do not come up."""
    stack.start()
    stack.start_servers()
    stack.start_worker()
    stack.start_beat()
    token = stack.run_python(
        "manage.py", "create_api_token", "bench-admin", "--role", "admin"
    ).strip()
    api = Api(stack.urls[0], token)
    api.allow_workloads(host_network=runtime != "docker")
    run = uuid.uuid4().hex[:8]
    seeded_path = workdir / "seeded.json"
    stack.run_python(
        "-m", "fleet.bench.seed", "setup", str(hosts), str(gpus_per_host),
        PRODUCT_KEY, run, str(seeded_path),
    )  # fmt: skip
    agents = Agents(stack, workdir, json.loads(seeded_path.read_text()), run, runtime)
    try:
        for host in agents.configs:
            agents.start(host)
        wait_until(
            lambda: api.ok("GET", "/api/v1/hosts/?status=ready&limit=1")["count"] == hosts,
            120,
            "every host ready",
        )
    except BaseException:
        agents.stop()
        raise
    return api, agents


def run_endpoints_bench(options: EndpointOptions) -> dict[str, Any]:
    arrivals = load_trace(options.trace, options.seconds, options.requests)
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="fleet-bench-ep-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stack = Stack(workdir, options.database_url, Options(hosts=options.hosts, servers=1))
    stack.env["FLEET_THROTTLE_USER"] = "1000000/min"
    agents: Agents | None = None
    load = os.getloadavg()
    try:
        if options.runtime == "docker":
            ensure_image(IMAGE)
        api, agents = seeded_fleet(
            stack, workdir, options.hosts, options.gpus_per_host, options.runtime
        )
        make = container_workload if options.runtime == "docker" else workload
        path = generate_path(options.runtime)
        deployment = api.ok(
            "POST",
            "/api/v1/deployments/",
            {
                "name": "bench-endpoints",
                "kind": "gpu",
                "gpu_count": 1,
                "replicas": options.replicas,
                "auto": True,
                "workload": make(1),
                "endpoint": {"port": "http", "path_prefix": PATH_PREFIX},
            },
        )
        dep = int(deployment["id"])
        wait_until(
            lambda: sum(a["ready"] for a in api.allocations(dep)) == options.replicas,
            options.timeout_s,
            f"{options.replicas} copies ready",
        )
        gateway_port = free_port()
        gateway_dir = workdir / "gateway"
        stack.spawn(
            "gateway",
            [
                sys.executable, "manage.py", "fleet_gateway",
                "--listen", f"127.0.0.1:{gateway_port}",
                "--directory", str(gateway_dir), "--metrics", "none",
            ],
        )  # fmt: skip
        wait_until(
            lambda: _servers_in(gateway_dir / "admin.sock") == options.replicas,
            60,
            "the gateway holding every copy",
        )
        options.log(f"{options.replicas} copies ready behind 127.0.0.1:{gateway_port}")
        addresses = [str(a["address"]) for a in api.allocations(dep)]
        direct = replay(
            [(a.rpartition(":")[0], int(a.rpartition(":")[2]), path) for a in addresses],
            arrivals,
        )
        options.log(f"direct replay: {len(direct.outcomes)} requests")
        events = workdir / "gateway-watch.jsonl"
        stack.spawn(
            "watch",
            [sys.executable, "-m", "fleet.bench.gateway_watch", str(gateway_dir / "admin.sock"),
             str(events)],
        )  # fmt: skip
        scenario = Scenario(
            api,
            dep,
            options.replicas,
            kill_agent=agents.kill,
            start_agent=agents.start,
            agent_down_s=options.agent_down_s,
            timeout_s=options.timeout_s,
            log=options.log,
            kill_copy=functools.partial(kill_container, hostname_prefix=agents.hostname_prefix)
            if options.runtime == "docker"
            else None,
        )
        origin = time.monotonic()

        def changes() -> None:
            time.sleep(options.lead_in_s)
            scenario.run(list(options.changes))

        changer = threading.Thread(target=changes, daemon=True)
        changer.start()
        through = replay([("127.0.0.1", gateway_port, PATH_PREFIX + path)], arrivals)
        replay_ended = time.monotonic()
        changer.join(options.timeout_s * max(1, len(options.changes)))
        time.sleep(1.0)  # the watcher's last polls
        watcher = stack.processes.pop("watch")
        if watcher.poll() is not None:
            raise RuntimeError(f"the gateway watcher exited ({watcher.returncode}): see watch.log")
        terminate(watcher, 10)
        return endpoint_report.report(
            direct=direct,
            through=through,
            changes=scenario.changes,
            wanted=list(options.changes),
            events=events,
            origin=origin,
            replay_ended=replay_ended,
            setup={
                "seconds": options.seconds,
                "trace": options.trace.name,
                "trace_requests": len(arrivals),
                "rate_per_s": round(len(arrivals) / options.seconds, 1),
                "replicas": options.replicas,
                "hosts": options.hosts,
                "agent_down_s": options.agent_down_s,
                "runtime": options.runtime,
                "cpus": os.cpu_count(),
                "load_average_at_start": [round(x, 2) for x in load],
            },
        )
    finally:
        if agents is not None:
            agents.stop()
        stack.stop()


def _servers_in(socket: Path) -> int:
    from fleet.endpoints.haproxy.config import ACTIVATOR
    from fleet.endpoints.haproxy.runtime import RuntimeApi, RuntimeApiError, servers_state

    if not socket.exists():
        return 0
    try:
        rows = servers_state(RuntimeApi(socket))
    except RuntimeApiError:
        return 0
    return sum(
        1
        for r in rows
        if r.backend.startswith("ep_") and r.name != ACTIVATOR and not (r.drain or r.maint)
    )


__all__ = ["ROOT", "EndpointOptions", "run_endpoints_bench"]
