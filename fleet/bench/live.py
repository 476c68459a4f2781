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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleet.bench import seed
from fleet.bench.browsers import DROP_AFTER_S, Browser, measure
from fleet.bench.options import Options
from fleet.bench.processes import terminate
from fleet.bench.stack import ROOT, Stack, cpu_seconds

SWARM = [sys.executable, "-m", "hostagent.swarm"]


# -- the run -------------------------------------------------------------------------------------


def run_bench(options: Options) -> dict[str, Any]:
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:8]
    stack: Stack | None = None
    swarms: list[subprocess.Popen[bytes]] = []
    try:
        if options.urls:
            urls, env = options.urls, dict(os.environ)
            seeded = _seed_here(options, run)
        else:
            if not options.database_url.startswith("postgres"):
                raise SystemExit("bench_live starts its own stack on PostgreSQL: --database-url")
            stack = Stack(workdir, options.database_url, options)
            options.log(f"starting the stack in {workdir} …")
            stack.start()
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
            seeded = json.loads(out.read_text())
            stack.start_servers()
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


def _seed_here(options: Options, run: str) -> dict[str, Any]:
    return seed.setup(
        hosts=options.hosts,
        gpus_per_host=options.gpus_per_host,
        product_key=options.product,
        run=run,
        enrolled=options.enrolled,
    )


def _swarm_configs(
    options: Options, urls: list[str], hosts: list[dict[str, Any]], workdir: Path
) -> list[Path]:
    per_server: list[list[dict[str, Any]]] = [[] for _ in urls]
    for i, host in enumerate(hosts):
        per_server[i % len(urls)].append(host)
    processes = options.swarms or max(1, math.ceil(len(hosts) / 400))
    processes = max(len(urls), processes)
    configs = []
    for s, (url, group) in enumerate(zip(urls, per_server, strict=True)):
        share = max(1, round(processes / len(urls)))
        size = max(1, math.ceil(len(group) / share))
        for c, start in enumerate(range(0, len(group), size)):
            path = workdir / f"swarm-{s}-{c}.json"
            chunk = group[start : start + size]
            path.write_text(
                json.dumps(
                    {
                        "server": url,
                        "interval_s": options.interval_s,
                        "allow_mutation": False,
                        "hostname_prefix": f"bench-{s}-{c}",
                        "hosts": [{"token": h["token"], "gpus": h["gpus"]} for h in chunk],
                    }
                )
            )
            path.chmod(0o600)
            configs.append(path)
    return configs


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
    try:
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 30)
        failed = [b.closed for b in browsers if not b.connections]
        if failed:
            raise RuntimeError(f"browser socket refused: {failed[0]}")
        configs = _swarm_configs(options, urls, hosts, workdir)
        for config in configs:
            log = (workdir / f"{config.stem}.log").open("ab")
            swarms.append(
                subprocess.Popen(
                    [*SWARM, str(config), "--stats", str(config.with_suffix(".stats"))],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        options.log(
            f"{options.hosts} agents ({total_gpus} GPUs) in {len(configs)} processes, "
            f"{len(urls)} server(s), {len(browsers)} browser(s); warming up …"
        )
        started = time.monotonic()
        warm = False
        while time.monotonic() - started < options.warmup_timeout_s:
            await asyncio.sleep(0.5)
            if all(len(b.received) >= total_gpus for b in browsers):
                warm = True
                break
            if any(p.poll() is not None for p in swarms):
                raise RuntimeError("an agent process exited during the warm-up (see its log)")
        warmup_s = time.monotonic() - started
        await asyncio.sleep(3.0 if warm else 0.0)  # let the hello burst drain
        pids = _pids(stack, options, swarms)
        before = {role: _cpu(p) for role, p in pids.items()}
        t0 = time.time()
        options.log(f"warm after {warmup_s:.1f}s (complete: {warm}); measuring {options.seconds}s")
        await asyncio.sleep(options.seconds)
        t1 = time.time()
        after = {role: _cpu(p) for role, p in pids.items()}
        await asyncio.sleep(DROP_AFTER_S + 0.5)
    finally:
        stop_browsers.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    stats = await asyncio.to_thread(_stop_swarms, swarms, workdir)
    sent = _sent_by_host(stats, hosts)
    gpus_by_host = await asyncio.to_thread(_gpu_map, stack, [h["host_id"] for h in hosts], workdir)
    measured = measure(browsers=browsers, sent=sent, gpus_by_host=gpus_by_host, t0=t0, t1=t1)
    seconds = t1 - t0
    cpu = {
        role: round((sum(after[role]) - sum(before[role])) / seconds * 100, 1)
        for role in before
        if before[role] is not None and after[role] is not None
    }
    asgi = [
        round((a - b) / seconds * 100, 1)
        for b, a in zip(before["asgi"] or [], after["asgi"] or [], strict=False)
    ]
    result: dict[str, Any] = {
        "hosts": options.hosts,
        "gpus": total_gpus,
        "gpus_reporting": sum(len(v) for v in gpus_by_host.values()),
        "seconds": round(seconds, 1),
        "interval_s": options.interval_s,
        **measured,
        "server_cpu_percent": round(sum(asgi), 1) if asgi else None,
        "server_cpu_percent_each": asgi,
        "cpu_percent": {k: v for k, v in cpu.items() if k != "asgi"},
        "topology": {
            "asgi_servers": len(urls),
            "agent_processes": len(swarms),
            "browsers": len(browsers),
            "machine_cpus": os.cpu_count(),
            "own_stack": stack is not None,
            "fleet_enrolled": options.enrolled,
            "channel_layer": "redis",
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
        "goal_met": bool(
            warm
            and measured["dropped"] == 0
            and measured["latency_ms"]["p99"] is not None
            and measured["latency_ms"]["p99"] < 1000
        ),
        "definitions": {
            "latency_ms": "browser receipt time - sample ts (agent clock, same machine)",
            "dropped": (
                f"sent samples whose GPU showed neither them nor a newer sample in the browser "
                f"within {DROP_AFTER_S:.0f} s of their ts (summed over browsers)"
            ),
            "server_cpu_percent": "CPU of the ASGI server processes, percent of one core",
        },
    }
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


def _cpu(pids: list[int]) -> Any:
    values = [cpu_seconds(p) for p in pids]
    return None if not values or any(v is None for v in values) else values


def _stop_swarms(swarms: list[subprocess.Popen[bytes]], workdir: Path) -> list[dict[str, Any]]:
    for process in swarms:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in swarms:
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    stats = []
    for path in sorted(workdir.glob("swarm-*.stats")):
        with contextlib.suppress(OSError, ValueError):
            stats.append(json.loads(path.read_text()))
    return stats


def _sent_by_host(
    stats: list[dict[str, Any]], hosts: list[dict[str, Any]]
) -> dict[int, list[float]]:
    by_token = {h["token"]: int(h["host_id"]) for h in hosts}
    sent: dict[int, list[float]] = {}
    for stat in stats:
        for host in stat["hosts"]:
            if host["token"] in by_token:
                sent[by_token[host["token"]]] = [float(t) for t in host["sent_ts"]]
    return sent


def _gpu_map(stack: Stack | None, host_ids: list[int], workdir: Path) -> dict[int, list[int]]:
    if stack is None:
        raw = seed.gpu_map(host_ids)
    else:
        source, out = workdir / "host-ids.json", workdir / "gpu-map.json"
        source.write_text(json.dumps(host_ids))
        stack.run_python("-m", "fleet.bench.seed", "gpus", str(source), str(out))
        raw = json.loads(out.read_text())
    return {int(k): v for k, v in raw.items()}
