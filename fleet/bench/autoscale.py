"""``bench_autoscale``: a real request trace through the real balancer, against static peak, static
median and Fleet's autoscaling, on the production stack.

It starts its own stack on loopback (:class:`fleet.bench.stack.Stack`: a scratch PostgreSQL
database, a private Redis, daphne, a Celery worker and beat evaluating the policies every
``evaluate_every_s``), one ``hostagent.swarm`` per host (the real agent on simulated GPUs, its
replicas real processes) and ``manage.py fleet_gateway`` (HAProxy). Each mode is a deployment of
:mod:`fleet.bench.token_server` copies (1 ms per 10 tokens; each serves at most ``concurrency``
requests at once, the others wait in its queue) behind its own endpoint, one mode after the
other; the Azure trace (:mod:`fleet.bench.autoscale_trace`) is replayed through the gateway.

* ``static_peak``: replicas for the trace's peak minute at ``target`` in flight per replica;
* ``static_median``: for its median minute;
* ``autoscale``: Fleet's policy ``in_flight_per_replica`` at ``target``, from 1 to every GPU,
  its cooldowns (30 s out, 300 s in) and the beat's period compressed with the trace.

Measured per mode: latency through the gateway, failures, the replicas' usage over the replay as
the usage module counts it (replica-seconds, GPU-equivalent hours), the scale events (the
``autoscale`` operations) and how long each scale-out took to a ready replica.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet.autoscaling.rule import Limits
from fleet.bench import autoscale_report
from fleet.bench.api import Api
from fleet.bench.autoscale_lag import tolerated_lag
from fleet.bench.autoscale_trace import (
    TRACES,
    Trace,
    first_minute_replicas,
    load_replay,
    mean_service_s,
    sharpened,
    static_sizes,
)
from fleet.bench.endpoints import Agents, _servers_in, seeded_fleet, workload
from fleet.bench.options import Options
from fleet.bench.processes import free_port, wait_until
from fleet.bench.replay import replay
from fleet.bench.stack import Stack

MODES = ("static_peak", "static_median", "autoscale")
SCALE_OUT_COOLDOWN_S = 30.0  # the policy's, in trace time
SCALE_IN_COOLDOWN_S = 300.0


@dataclass
class AutoscaleOptions:
    trace: str = "conv"
    seconds: float = 150.0
    modes: tuple[str, ...] = MODES
    sharpen: bool = False
    concurrency: int = 8  # C: requests one replica serves at once
    target: float = 5.0  # in flight per replica: the static sizes, and the in-flight target
    # The autoscaler's metric: "in_flight" (per replica, at ``target``) or "requests" (per
    # replica per second, at ``rate_target``, else at the rate that keeps ``target`` in flight
    # by Little's law: target / the trace's mean service time).
    metric: str = "in_flight"
    rate_target: float | None = None
    # Replay only the trace's first minutes (a milder compression for a short replay).
    trace_minutes: float | None = None
    # The rule's scale-out step limit (FLEET_AUTOSCALE_MAX_STEP_OUT); None: none.
    max_step_out: int | None = None
    # The policy's scale-in cooldown, in trace time (compressed with the trace).
    scale_in_cooldown_s: float = SCALE_IN_COOLDOWN_S
    hosts: int = 4
    gpus_per_host: int = 4
    trace_path: Path | None = None
    evaluate_every_s: float = 1.0
    database_url: str = ""
    workdir: Path | None = None
    timeout_s: float = 180.0
    log: Any = print


def rate_target(options: AutoscaleOptions, trace: Trace) -> float:
    """Requests per replica per second that keep ``target`` in flight (Little's law)."""
    if options.rate_target is not None:
        return options.rate_target
    return round(options.target / mean_service_s(trace), 2)


def policy(options: AutoscaleOptions, trace: Trace, most: int) -> dict[str, Any]:
    """The autoscaling policy, its cooldowns compressed with the trace."""
    target = (
        {"requests_per_replica_per_s": rate_target(options, trace)}
        if options.metric == "requests"
        else {"in_flight_per_replica": options.target}
    )
    return {
        "min": 1,
        "max": most,
        "target": target,
        "scale_out_cooldown_s": round(SCALE_OUT_COOLDOWN_S / trace.factor),
        "scale_in_cooldown_s": round(options.scale_in_cooldown_s / trace.factor),
    }


class Sampler:
    """Polls the deployment's replicas (placed, ready) every ``every_s`` during a replay."""

    def __init__(self, api: Api, deployment: int, every_s: float = 1.0) -> None:
        self.api, self.deployment, self.every_s = api, deployment, every_s
        self.samples: list[tuple[float, int, int]] = []  # (monotonic, placed, ready)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                rows = [a for a in self.api.allocations(self.deployment) if a.get("gpu_slot") == 0]
            except (OSError, RuntimeError):
                rows = None
            if rows is not None:
                ready = sum(1 for a in rows if a.get("ready"))
                self.samples.append((time.monotonic(), len(rows), ready))
            self.stop.wait(self.every_s)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Bench:
    def __init__(self, options: AutoscaleOptions, stack: Stack, api: Api, gateway: int) -> None:
        self.options, self.stack, self.api, self.gateway = options, stack, api, gateway

    def run_mode(
        self, mode: str, trace: Trace, replicas: int, scaling: dict[str, Any] | None
    ) -> dict[str, Any]:
        options, api = self.options, self.api
        wl = workload(1)
        wl["env"]["CONCURRENCY"] = str(options.concurrency)
        dep = int(
            api.ok(
                "POST",
                "/api/v1/deployments/",
                {
                    "name": f"bench-{mode.replace('_', '-')}-{uuid.uuid4().hex[:4]}",
                    "kind": "gpu",
                    "gpu_count": 1,
                    "replicas": replicas,
                    "auto": True,
                    "workload": wl,
                    "endpoint": {"port": "http", "path_prefix": f"/{mode}"},
                },
            )["id"]
        )
        wait_until(
            lambda: sum(a["ready"] for a in api.allocations(dep)) == replicas,
            options.timeout_s,
            f"{mode}: {replicas} replicas ready",
        )
        socket = self.stack.workdir / "gateway" / "admin.sock"
        wait_until(lambda: _servers_in(socket) == replicas, 60, f"{mode}: the gateway")
        options.log(f"{mode}: {replicas} replicas ready; replaying {len(trace.arrivals)} requests")
        if scaling is not None:
            api.ok("PATCH", f"/api/v1/deployments/{dep}/", {"autoscaling": scaling})
        started_at, origin = datetime.now(UTC), time.monotonic()
        with Sampler(api, dep) as sampler:
            replayer = replay([("127.0.0.1", self.gateway, f"/{mode}/generate")], trace.arrivals)
        ended_at = datetime.now(UTC)
        usage = api.ok(
            "GET",
            f"/api/v1/usage?group_by=deployment&from={_iso(started_at)}&to={_iso(ended_at)}",
        )
        row = next((g for g in usage["groups"] if str(g["key"]) == str(dep)), None)
        operations = api.ok(
            "GET", f"/api/v1/operations/?kind=autoscale&deployment={dep}&limit=1000"
        )["results"]
        api.ok("DELETE", f"/api/v1/deployments/{dep}/")
        wait_until(lambda: not api.allocations(dep), options.timeout_s, f"{mode}: deleted")
        wait_until(lambda: _servers_in(socket) == 0, 60, f"{mode}: out of the gateway")
        return autoscale_report.mode_result(
            replayer=replayer,
            origin=origin,
            started_at=started_at,
            usage=row,
            operations=operations,
            samples=sampler.samples,
            initial=replicas,
        )


def run_autoscale_bench(options: AutoscaleOptions) -> dict[str, Any]:
    trace = load_replay(options.trace, options.seconds, options.trace_path, options.trace_minutes)
    sizes = static_sizes(trace, options.target)
    replayed, burst_at = sharpened(trace) if options.sharpen else (trace, None)
    gpus = options.hosts * options.gpus_per_host
    if sizes["static_peak"] > gpus:
        raise RuntimeError(f"static peak needs {sizes['static_peak']} GPUs; there are {gpus}")
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="fleet-bench-as-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stack = Stack(workdir, options.database_url, Options(hosts=options.hosts, servers=1))
    stack.env["FLEET_THROTTLE_USER"] = "1000000/min"
    stack.env["FLEET_AUTOSCALE_SECONDS"] = str(options.evaluate_every_s)
    if options.max_step_out is not None:
        stack.env["FLEET_AUTOSCALE_MAX_STEP_OUT"] = str(options.max_step_out)
    agents: Agents | None = None
    load = os.getloadavg()
    try:
        api, agents = seeded_fleet(stack, workdir, options.hosts, options.gpus_per_host)
        gateway = free_port()
        stack.spawn(
            "gateway",
            [
                sys.executable, "manage.py", "fleet_gateway",
                "--listen", f"127.0.0.1:{gateway}",
                "--directory", str(workdir / "gateway"), "--metrics", "none",
            ],
        )  # fmt: skip
        bench = Bench(options, stack, api, gateway)
        scaling = policy(options, trace, gpus)
        results: dict[str, Any] = {}
        for mode in options.modes:
            if mode == "autoscale":
                start = first_minute_replicas(trace, options.target)
                results[mode] = bench.run_mode(mode, replayed, start, scaling)
            else:
                results[mode] = bench.run_mode(mode, replayed, sizes[mode], None)
        lag_model = tolerated_lag(
            replayed,
            concurrency=options.concurrency,
            static_peak=sizes["static_peak"],
            start=first_minute_replicas(trace, options.target),
            limits=Limits(
                min=int(scaling["min"]),
                max=int(scaling["max"]),
                target=options.target,
                scale_out_cooldown_s=float(scaling["scale_out_cooldown_s"]),
                scale_in_cooldown_s=float(scaling["scale_in_cooldown_s"]),
                max_step_out=options.max_step_out,
            ),
            evaluate_every_s=options.evaluate_every_s,
        )
        return autoscale_report.report(
            results,
            lag_model=lag_model,
            setup={
                "trace": options.trace,
                "trace_file": (options.trace_path or TRACES[options.trace]).name,
                "seconds": options.seconds,
                "trace_span_s": round(trace.span_s, 1),
                "compression": round(trace.factor, 2),
                "requests": len(replayed.arrivals),
                "sharpened": options.sharpen,
                "burst_at_s": None if burst_at is None else round(burst_at, 2),
                "concurrency_per_replica": options.concurrency,
                "target_in_flight_per_replica": options.target,
                "metric": options.metric,
                "trace_minutes": options.trace_minutes,
                "max_step_out": options.max_step_out,
                "scale_in_cooldown_trace_s": options.scale_in_cooldown_s,
                "replicas": {**sizes, "autoscale_max": gpus},
                "policy": scaling,
                "evaluate_every_s": options.evaluate_every_s,
                "cpus": os.cpu_count(),
                "load_average_at_start": [round(x, 2) for x in load],
            },
        )
    finally:
        if agents is not None:
            agents.stop()
        stack.stop()
