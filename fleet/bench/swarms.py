"""The simulated agents of the live bench: ``python -m hostagent.swarm`` processes (many agents
per process, one WebSocket each), their configs split round-robin across the servers as a load
balancer would, and what they report they sent."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from fleet.bench.options import Options
from fleet.bench.stack import ROOT

SWARM = [sys.executable, "-m", "hostagent.swarm"]


def swarm_configs(
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
                        # Agents that apply what they are given: replicas placed on them stay
                        # where they are (refused items would fail their operations).
                        "allow_mutation": options.replicas_to_place > 0,
                        "hostname_prefix": f"bench-{s}-{c}",
                        "hosts": [{"token": h["token"], "gpus": h["gpus"]} for h in chunk],
                    }
                )
            )
            path.chmod(0o600)
            configs.append(path)
    return configs


def start_swarms(
    configs: list[Path], workdir: Path, env: dict[str, str], swarms: list[subprocess.Popen[bytes]]
) -> None:
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


def stop_swarms(swarms: list[subprocess.Popen[bytes]], workdir: Path) -> list[dict[str, Any]]:
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


def sent_by_host(
    stats: list[dict[str, Any]], hosts: list[dict[str, Any]]
) -> dict[int, list[float]]:
    by_token = {h["token"]: int(h["host_id"]) for h in hosts}
    sent: dict[int, list[float]] = {}
    for stat in stats:
        for host in stat["hosts"]:
            if host["token"] in by_token:
                sent[by_token[host["token"]]] = [float(t) for t in host["sent_ts"]]
    return sent
