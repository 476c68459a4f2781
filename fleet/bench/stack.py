"""The stack ``bench_live`` starts: a scratch PostgreSQL database, a private Redis and N daphne
servers, all on loopback, in production mode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from fleet.bench.processes import (
    create_database,
    drop_database,
    free_port,
    production_env,
    redis_command,
    redis_ping,
    terminate,
    wait_until,
)

if TYPE_CHECKING:
    from fleet.bench.options import Options

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process, from ``/proc/<pid>/stat``."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Stack:
    """PostgreSQL scratch database + private Redis + N daphne servers, all on loopback."""

    def __init__(self, workdir: Path, database_url: str, options: Options) -> None:
        self.workdir = workdir
        self.db_name = f"fleet_bench_{uuid.uuid4().hex[:10]}"
        self.server_url = database_url.rsplit("/", 1)[0]
        self.redis_port = free_port()
        self.ports = [free_port() for _ in range(options.servers)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.env = production_env(
            f"{self.server_url}/{self.db_name}",
            self.redis_port,
            workdir / "data",
            FLEET_LOG_LEVEL="WARNING",
        )
        if options.channel_capacity is not None:
            self.env["FLEET_CHANNEL_CAPACITY"] = str(options.channel_capacity)
        if options.live_batch_s is not None:
            self.env["FLEET_LIVE_BATCH_SECONDS"] = str(options.live_batch_s)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.db_created = False

    def start(self) -> None:
        create_database(self.server_url, self.db_name)
        self.db_created = True
        self.spawn("redis", redis_command(self.redis_port))
        wait_until(lambda: redis_ping(self.redis_port), 10, "redis")
        self.run_python("manage.py", "migrate", "-v0")

    def start_servers(self) -> None:
        for i, port in enumerate(self.ports):
            self.spawn(
                f"daphne-{i}",
                [
                    str(BIN / "daphne"),
                    "-v",
                    "0",
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "fleet.asgi:application",
                ],
            )
        for url in self.urls:
            wait_until(lambda u=url: _healthy(u), 30, f"the ASGI server at {url}")  # type: ignore[misc]

    @property
    def database_url(self) -> str:
        return f"{self.server_url}/{self.db_name}"

    def start_workers(self) -> None:
        """A Celery worker and beat: pushes, offline hosts, evictions (what could move a replica
        when hosts fall silent)."""
        self.spawn(
            "worker", [str(BIN / "celery"), "-A", "fleet", "worker", "-l", "warning", "-c", "1"]
        )
        schedule = str(self.workdir / "beat-schedule")
        self.spawn(
            "beat", [str(BIN / "celery"), "-A", "fleet", "beat", "-l", "warning", "-s", schedule]
        )

    def restart_servers(self) -> float:
        """Stop every ASGI server at once (SIGTERM, as ``systemctl restart`` does) and start them
        again on the same ports; returns when they were told to stop (Unix time)."""
        names = [n for n in self.processes if n.startswith("daphne")]
        stopped = time.time()
        for name in names:
            self.processes[name].send_signal(signal.SIGTERM)
        for name in names:
            terminate(self.processes.pop(name), 15)
        self.start_servers()
        return stopped

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            args,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = process
        return process

    def run_python(self, *args: str, timeout: float = 300) -> str:
        result = subprocess.run(
            [sys.executable, *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {result.stderr[-2000:]}")
        return result.stdout

    def server_pids(self) -> list[int]:
        return [p.pid for n, p in self.processes.items() if n.startswith("daphne")]

    def pg_backend_pids(self) -> list[int]:
        import psycopg

        with psycopg.connect(f"{self.server_url}/postgres", autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", [self.db_name]
            ).fetchall()
        return [int(r[0]) for r in rows]

    def stop(self) -> None:
        for name in list(self.processes):
            terminate(self.processes.pop(name))
        if self.db_created:
            drop_database(self.server_url, self.db_name)
            self.db_created = False


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
