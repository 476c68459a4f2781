"""``bench_live``: simulated agents and browser sockets against the real stack; JSON out.

What runs (default, like ``tests/e2e/stack.py``; see :mod:`fleet.bench.stack`): a scratch
PostgreSQL database on the server ``--database-url`` names, a private Redis, ``--servers``
daphne processes (agents are split round-robin across them, as a load balancer would; browsers
too), no Celery worker (telemetry needs none). The hosts and their per-host tokens are created
through the services (``host_create`` + ``host_issue_token``) with their GPUs already known
(``gpus_adopt``: a fleet whose servers restarted; ``--new-hosts`` leaves them to the agents'
first hellos). The agents run as ``python -m hostagent.swarm`` processes (many agents per
process, one WebSocket each, the real simulated backend and collector), and ``--browsers``
WebSocket clients log in with a session cookie on ``/ws/fleet/`` and subscribe to every GPU
(the worst case for a browser).

What it measures (:mod:`fleet.bench.browsers`), in a window of ``--seconds`` after a warm-up
(every GPU seen by a browser):

* ``latency_ms``: for each GPU sample a browser receives, receipt time minus the sample's
  ``ts`` (the agent's clock; same machine), p50/p90/p99/max over all browsers;
* ``samples_per_s``: distinct GPU samples received per second by one browser (mean over
  browsers); ``sent_per_s``: GPU samples the agents sent per second;
* ``dropped``: sent samples (``ts`` in the window) for which the browser received neither that
  sample nor a newer one of the same GPU within ``DROP_AFTER_S`` (2 s) of its ``ts``, summed over
  browsers. A sample superseded by a newer one that arrived in time (coalescing) is not dropped.
  ``late``: samples received more than 1 s after their ``ts``.
* ``server_cpu_percent``: CPU time of the ASGI server processes over the window, in percent of
  one core (``/proc/<pid>/stat``; 200 = two cores busy); ``cpu_percent`` breaks down every
  process the bench started (Redis, the stack's PostgreSQL backends, agents, the bench itself).
* ``efficiency``: distinct GPU samples delivered to a browser per second of server CPU
  (``samples_per_s / (server_cpu_percent / 100)``): runs on different machines compare as
  ratios of it.
* ``update_gap_s``: the longest time a GPU went without a new sample reaching a browser in the
  window (p50/p99/max over GPUs and browsers); ``load_frames``: browser frames by the load level
  they carried (:mod:`fleet.live.load`; 1 and 2: the servers coarsened telemetry and the fleet
  view said so).
* ``admitted``: seconds after the agents started until 99 % and 100 % of them had a socket;
  ``abusive_closes``: agents whose socket was closed as abusive; ``hosts_offline``: hosts the
  control plane marked offline during the run (with ``--goal storm|overload`` a Celery worker
  and beat run, as in production, and place ``--replicas``; ``replicas_moved`` counts those
  that moved or were released).
* ``--restart-at S``: every ASGI server is restarted once (SIGTERM, then started again), S
  seconds into the window; ``restart.recovery`` is how long after the stop 99 % and 100 % of
  hosts had a fresh sample reach a browser; ``samples_lost`` is ``dropped`` (a sample the
  agent took while its server was down is lost).

Goals (``goal_met``; ``goals`` lists each check): ``latency`` (default): p99 under 1 s and
nothing dropped; ``storm`` (default with ``--restart-at``): 99 % of hosts back within 30 s, all
within 60 s, no replica moved, no agent closed as abusive; ``overload``: every agent admitted
within 60 s, no host offline, every GPU updated at least every 5 s, the load shown. A warm-up
that does not complete fails every goal, and the command exits non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleet.bench import seed
from fleet.bench.browsers import DROP_AFTER_S, Browser, measure, update_gaps
from fleet.bench.goals import DEFINITIONS, goals, load_frames
from fleet.bench.options import Options
from fleet.bench.processes import terminate
from fleet.bench.stack import Stack
from fleet.bench.storm import CpuMeter, OfflineWatch, admitted, closes, moved, recovery
from fleet.bench.swarms import sent_by_host, start_swarms, stop_swarms, swarm_configs
from hostagent import protocol

# -- the run -------------------------------------------------------------------------------------


def run_bench(options: Options) -> dict[str, Any]:
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:8]
    stack: Stack | None = None
    swarms: list[subprocess.Popen[bytes]] = []
    try:
        if options.urls:
            if options.restart_at is not None:
                raise SystemExit("--restart-at restarts the servers it starts: not with --url")
            urls, env = options.urls, dict(os.environ)
            seeded = _seed_here(options, run)
        else:
            if not options.database_url.startswith("postgres"):
                raise SystemExit("bench_live starts its own stack on PostgreSQL: --database-url")
            stack = Stack(workdir, options.database_url, options)
            options.log(f"starting the stack in {workdir} …")
            stack.start()
            seeded = _seed_stack(stack, options, run, workdir)
            stack.start_servers()
            if options.chosen_goal != "latency":
                stack.start_workers()
            urls, env = stack.urls, stack.env
        result = asyncio.run(_drive(options, urls, env, seeded, workdir, stack, swarms, run))
    finally:
        for process in swarms:
            terminate(process, 20)
        if stack is not None:
            stack.stop()
        elif options.urls:
            with contextlib.suppress(Exception):
                seed.cleanup(run)
    return result


def _seed_stack(stack: Stack, options: Options, run: str, workdir: Path) -> dict[str, Any]:
    out = workdir / "seed.json"
    stack.run_python(
        "-m",
        "fleet.bench.seed",
        "setup",
        str(options.hosts),
        str(options.gpus_per_host),
        options.product,
        run,
        str(out),
        *([] if options.enrolled else ["--new"]),
    )
    return dict(json.loads(out.read_text()))


def _seed_here(options: Options, run: str) -> dict[str, Any]:
    return seed.setup(
        hosts=options.hosts,
        gpus_per_host=options.gpus_per_host,
        product_key=options.product,
        run=run,
        enrolled=options.enrolled,
    )


async def _warm_up(
    options: Options, browsers: list[Browser], swarms: list[subprocess.Popen[bytes]], total: int
) -> tuple[bool, float]:
    started = time.monotonic()
    while time.monotonic() - started < options.warmup_timeout_s:
        await asyncio.sleep(0.5)
        if all(len(b.received) >= total for b in browsers):
            return True, time.monotonic() - started
        if any(p.poll() is not None for p in swarms):
            raise RuntimeError("an agent process exited during the warm-up (see its log)")
    return False, time.monotonic() - started


async def _drive(
    options: Options,
    urls: list[str],
    env: dict[str, str],
    seeded: dict[str, Any],
    workdir: Path,
    stack: Stack | None,
    swarms: list[subprocess.Popen[bytes]],
    run: str,
) -> dict[str, Any]:
    hosts = seeded["hosts"]
    total_gpus = options.hosts * options.gpus_per_host
    stop_browsers = asyncio.Event()
    browsers = [
        Browser(url=urls[i % len(urls)], session_key=seeded["session_key"])
        for i in range(options.browsers)
    ]
    readies = [asyncio.Event() for _ in browsers]
    tasks = [
        asyncio.ensure_future(b.run(r, stop_browsers))
        for b, r in zip(browsers, readies, strict=True)
    ]
    meter = CpuMeter()
    watch: OfflineWatch | None = None
    restarted: float | None = None
    before: dict[int, tuple[int | None, int | None, str]] = {}
    try:
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 30)
        failed = [b.closed for b in browsers if not b.connections]
        if failed:
            raise RuntimeError(f"browser socket refused: {failed[0]}")
        configs = swarm_configs(options, urls, hosts, workdir)
        swarm_started = time.time()
        start_swarms(configs, workdir, env, swarms)
        if stack is not None and options.chosen_goal != "latency":
            watch = OfflineWatch(stack.database_url, [h["host_id"] for h in hosts]).start()
        options.log(
            f"{options.hosts} agents ({total_gpus} GPUs) in {len(configs)} processes, "
            f"{len(urls)} server(s), {len(browsers)} browser(s); warming up …"
        )
        warm, warmup_s = await _warm_up(options, browsers, swarms, total_gpus)
        if stack is not None and options.replicas_to_place and warm:
            # Work on the fleet, placed by the engine on hosts that are up; pushed and applied
            # during the settling below.
            await asyncio.to_thread(
                stack.run_python,
                "-m",
                "fleet.bench.seed",
                "place",
                run,
                str(options.replicas_to_place),
            )
        await asyncio.sleep(5.0 if warm else 0.0)  # let the hello burst drain
        if stack is not None:
            before = await asyncio.to_thread(seed.placements, stack.database_url)
        if watch is not None:
            watch.reset()  # what counts is the window
        pids = await asyncio.to_thread(_pids, stack, options, swarms)
        for role, role_pids in pids.items():
            meter.start(role, role_pids)
        t0 = time.time()
        options.log(f"warm after {warmup_s:.1f}s (complete: {warm}); measuring {options.seconds}s")
        if options.restart_at is not None and stack is not None:
            await asyncio.sleep(options.restart_at)
            options.log("restarting every ASGI server …")
            for role in ("asgi", "postgres"):
                meter.stop(role)
            restarted = await asyncio.to_thread(stack.restart_servers)
            meter.start("asgi", stack.server_pids(), from_zero=True)
            meter.start("postgres", await asyncio.to_thread(stack.pg_backend_pids))
            await asyncio.sleep(max(0.0, t0 + options.seconds - time.time()))
        else:
            await asyncio.sleep(options.seconds)
        t1 = time.time()
        for role in list(pids):
            meter.stop(role)
        await asyncio.sleep(DROP_AFTER_S + 0.5)
    finally:
        stop_browsers.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if watch is not None:
            watch.stop()
    stats = await asyncio.to_thread(stop_swarms, swarms, workdir)
    after = await asyncio.to_thread(seed.placements, stack.database_url) if stack else {}
    sent = sent_by_host(stats, hosts)
    gpus_by_host = await asyncio.to_thread(_gpu_map, stack, [h["host_id"] for h in hosts], workdir)
    measured = measure(browsers=browsers, sent=sent, gpus_by_host=gpus_by_host, t0=t0, t1=t1)
    seconds = t1 - t0
    server_cpu = meter.percent("asgi", seconds)
    result: dict[str, Any] = {
        "hosts": options.hosts,
        "gpus": total_gpus,
        "gpus_reporting": sum(len(v) for v in gpus_by_host.values()),
        "seconds": round(seconds, 1),
        "interval_s": options.interval_s,
        **measured,
        "server_cpu_percent": server_cpu,
        "server_cpu_percent_each": [
            round(v / seconds * 100, 1) for v in meter.each.get("asgi", [])
        ],
        "efficiency": round(measured["samples_per_s"] / (server_cpu / 100)) if server_cpu else None,
        "cpu_percent": {
            role: meter.percent(role, seconds) for role in meter.total if role != "asgi"
        },
        "update_gap_s": update_gaps(browsers, t0, t1),
        "load_frames": load_frames(browsers),
        "admitted": admitted(stats, swarm_started),
        "abusive_closes": closes(stats, protocol.CLOSE_ABUSE),
        "retry_later_closes": closes(stats, protocol.CLOSE_RETRY_LATER),
        "hosts_offline": {"ever": len(watch.ever), "most_at_once": watch.most}
        if watch is not None
        else None,
        "replicas_placed": len(before),
        "replicas_moved": moved(before, after) if before else 0,
        "topology": {
            "asgi_servers": len(urls),
            "agent_processes": len(swarms),
            "browsers": len(browsers),
            "machine_cpus": os.cpu_count(),
            "own_stack": stack is not None,
            "fleet_enrolled": options.enrolled,
            "channel_layer": "redis",
            "celery": options.chosen_goal != "latency" and stack is not None,
        },
        "warmup_s": round(warmup_s, 1),
        "warmup_complete": warm,
        "browser_untimed_values": sum(b.untimed for b in browsers),
        "browser_gpus_seen": [len(b.received) for b in browsers],
        "browser_reconnects": sum(max(0, b.connections - 1) for b in browsers),
        "browser_frames_per_s": round(
            sum(b.frames for b in browsers) / count(browsers) / seconds, 2
        ),
        "browser_kbytes_per_s": round(
            sum(b.bytes for b in browsers) / count(browsers) / seconds / 1024, 1
        ),
    }
    if restarted is not None:
        result["restart"] = {
            "at_s": round(restarted - t0, 1),
            "recovery": recovery(browsers, gpus_by_host, restarted),
            "admitted_again": admitted(stats, restarted),
            "samples_lost": measured["dropped"],
        }
    result["goal"] = options.chosen_goal
    result["goals"] = goals(result, options.chosen_goal)
    result["goal_met"] = bool(warm and all(result["goals"].values()))
    result["definitions"] = DEFINITIONS
    return result


def count(items: Sequence[Any]) -> int:
    return max(1, len(items))


def _pids(
    stack: Stack | None, options: Options, swarms: list[subprocess.Popen[bytes]]
) -> dict[str, list[int]]:
    pids: dict[str, list[int]] = {
        "asgi": stack.server_pids() if stack else list(options.server_pids),
        "agents": [p.pid for p in swarms],
        "bench": [os.getpid()],
    }
    if stack is not None:
        pids["redis"] = [stack.processes["redis"].pid]
        pids["postgres"] = stack.pg_backend_pids()
    return pids


def _gpu_map(stack: Stack | None, host_ids: list[int], workdir: Path) -> dict[int, list[int]]:
    if stack is None:
        raw = seed.gpu_map(host_ids)
    else:
        source, out = workdir / "host-ids.json", workdir / "gpu-map.json"
        source.write_text(json.dumps(host_ids))
        stack.run_python("-m", "fleet.bench.seed", "gpus", str(source), str(out))
        raw = json.loads(out.read_text())
    return {int(k): v for k, v in raw.items()}
