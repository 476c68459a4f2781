"""The one launcher of the real product on loopback, for the benchmarks (``bench_*``), the
end-to-end tests (tests/e2e) and the browser tests (tests/browser).

- **Production mode** (``database_url`` names a PostgreSQL server): a scratch database on it, a
  private Redis, N daphne servers, Celery workers and beat, simulated agents
  (:meth:`~fleet.bench.stack_api.StackApi.add_agent`) and whatever else :meth:`Stack.spawn`
  starts (the gateway, a swarm). :meth:`Stack.up` starts all of it from a prepared template
  database; the benchmarks start it piece by piece (:meth:`Stack.start`, then
  :meth:`Stack.start_servers`, :meth:`Stack.start_workers`).
- **Embedded mode** (:meth:`Stack.start_demo`): ``manage.py demo``, one process on SQLite with its
  in-process scheduler and simulated agents.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.bench.processes import (
    create_database,
    drop_database,
    free_port,
    production_env,
    redis_command,
    redis_ping,
    terminate,
    terminate_all,
    wait_until,
)
from fleet.bench.stack_agent import Agent
from fleet.bench.stack_api import StackApi
from fleet.bench.stack_setup import (
    DEMO_ACCOUNTS,
    drain,
    embedded_env,
    prepared_database,
    read_passwords,
)

if TYPE_CHECKING:
    from fleet.bench.options import Options

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")

__all__ = ["BIN", "ROOT", "Agent", "Stack", "cpu_seconds", "wait_until"]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process, from ``/proc/<pid>/stat``."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Stack(StackApi):
    """The product's processes on loopback, each logging to ``workdir/<name>.log``.

    Args:
        workdir: the stack's scratch folder (logs, data directory, agents' files).
        database_url: a ``postgres://`` URL (its server gets a scratch database), or ``""``
            for the embedded mode.
        options: a benchmark's options (``servers``, channel capacity, live batch period).
        servers: how many ASGI servers (default: ``options.servers``, else 1).
        workers: how many Celery workers :meth:`up` starts.
        env: more ``FLEET_*`` settings for every process (default: warnings only).
        workload_policy: the default team's runtime policy that :meth:`up` sets.
        quiet: daphne without its access log.
        db_prefix: the scratch database's name prefix.
    """

    def __init__(
        self,
        workdir: Path,
        database_url: str = "",
        options: Options | None = None,
        *,
        servers: int | None = None,
        workers: int = 1,
        env: Mapping[str, str] | None = None,
        workload_policy: dict[str, Any] | None = None,
        quiet: bool = True,
        db_prefix: str = "fleet_bench",
    ) -> None:
        self.workdir = workdir
        self.embedded = not database_url
        count = servers if servers is not None else (options.servers if options else 1)
        self.db_name = f"{db_prefix}_{uuid.uuid4().hex[:10]}"
        self.server_url = database_url.rsplit("/", 1)[0]
        self.redis_port = free_port()
        self.ports = [free_port() for _ in range(count)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.worker_count = workers
        self.workload_policy = workload_policy
        self.quiet = quiet
        self.data_dir = workdir / "data"
        extra = dict(env) if env is not None else {"FLEET_LOG_LEVEL": "WARNING"}
        if options is not None and options.channel_capacity is not None:
            extra["FLEET_CHANNEL_CAPACITY"] = str(options.channel_capacity)
        if options is not None and options.live_batch_s is not None:
            extra["FLEET_LIVE_BATCH_SECONDS"] = str(options.live_batch_s)
        self.env = (
            embedded_env(self.data_dir, **extra)
            if self.embedded
            else production_env(self.database_url, self.redis_port, self.data_dir, **extra)
        )
        self.processes: dict[str, subprocess.Popen[Any]] = {}
        self.agents: list[Agent] = []
        self.db_created = False
        self.operator_token: str | None = None
        self.admin_token: str | None = None
        self.passwords: dict[str, str] = {}  # the demo accounts' (embedded mode)

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def http_ports(self) -> list[int]:
        return self.ports

    @property
    def tmp(self) -> Path:
        return self.workdir

    @property
    def database_url(self) -> str:
        return f"{self.server_url}/{self.db_name}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "demo.log"

    @property
    def process(self) -> subprocess.Popen[Any]:
        """The embedded mode's one process."""
        return self.processes["demo"]

    # -- production mode, all at once ---------------------------------------------------

    def up(self) -> Stack:
        """Everything: Redis, the database (a copy of the session's prepared template:
        migrated, static files collected, an operator's and an admin's token), the ASGI
        servers, the Celery workers and beat; returns once every server answers."""
        self.start_redis()
        prepared = prepared_database(self.server_url, self.env)
        create_database(self.server_url, self.db_name, template=prepared.database)
        self.db_created = True
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "static").symlink_to(prepared.static)
        self.operator_token, self.admin_token = prepared.operator_token, prepared.admin_token
        for index in range(len(self.ports)):
            self.spawn(_server_name(index), self._daphne(index))
        for _ in range(self.worker_count):
            self.start_worker()
        self.start_beat()
        for url in self.urls:
            wait_until(lambda u=url: _healthy(u), 30, f"the ASGI server {url}")  # type: ignore[misc]
        if self.workload_policy is not None:
            self.allow_workloads()
        return self

    # -- production mode, piece by piece (the benchmarks) -------------------------------

    def start(self) -> None:
        """The database (migrated) and Redis."""
        create_database(self.server_url, self.db_name)
        self.db_created = True
        self.start_redis()
        self.run_python("manage.py", "migrate", "-v0")

    def start_servers(self) -> None:
        for index in range(len(self.ports)):
            self.spawn(_server_name(index), self._daphne(index))
        for url in self.urls:
            wait_until(lambda u=url: _healthy(u), 30, f"the ASGI server at {url}")  # type: ignore[misc]

    def start_workers(self) -> None:
        """A Celery worker and beat: pushes, offline hosts, evictions (what could move a replica
        when hosts fall silent)."""
        self.spawn(
            "worker", [str(BIN / "celery"), "-A", "fleet", "worker", "-l", "warning", "-c", "1"]
        )
        self.start_beat()

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

    # -- single processes ---------------------------------------------------------------

    def start_redis(self) -> None:
        self.spawn("redis", redis_command(self.redis_port))
        wait_until(lambda: redis_ping(self.redis_port), 10, "redis")

    def restart_redis(self) -> None:
        """Redis killed (all it held lost) and started again empty on its port."""
        self.terminate("redis", signal.SIGKILL)
        self.start_redis()

    def stop_server(self, index: int = 0) -> None:
        """Stop one ASGI server (an upgrade, a crash): its agent and browser sockets drop."""
        self.terminate(_server_name(index))

    def start_server(self, index: int = 0) -> float:
        """Start a stopped ASGI server again on its port; returns ``time.monotonic()`` at the
        moment it answers ``/healthz``."""
        url = self.urls[index]
        self.spawn(_server_name(index), self._daphne(index))
        wait_until(lambda: _healthy(url), 30, f"the ASGI server {url} back", every=0.1)
        return time.monotonic()

    def start_worker(self) -> None:
        """One more Celery worker (solo pool, a name of its own)."""
        name = f"worker-{uuid.uuid4().hex[:6]}"
        celery = [str(BIN / "celery"), "-A", "fleet", "worker", "--pool=solo", "-l", "warning"]
        self.spawn(name, [*celery, "-n", f"{name}@%h"])

    def kill_worker(self) -> None:
        """SIGKILL every worker: tasks in flight are lost as in a crash."""
        for name in [n for n in self.processes if n.startswith("worker")]:
            self.terminate(name, signal.SIGKILL)

    def start_beat(self) -> None:
        schedule = str(self.workdir / "beat-schedule")
        self.spawn(
            "beat", [str(BIN / "celery"), "-A", "fleet", "beat", "-l", "warning", "-s", schedule]
        )

    def _daphne(self, index: int) -> list[str]:
        quiet = ["-v", "0"] if self.quiet else []
        port = str(self.ports[index])
        return [
            str(BIN / "daphne"),
            *quiet,
            "-b",
            "127.0.0.1",
            "-p",
            port,
            "fleet.asgi:application",
        ]

    # -- embedded mode ------------------------------------------------------------------

    def start_demo(self, *args: str, timeout: float = 120) -> Stack:
        """``manage.py demo`` on the first port (``args``: more of its options), its own
        process group; returns once it printed every demo account's password and answers."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("a")
        addr = f"127.0.0.1:{self.ports[0]}"
        process = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--addr", addr, *args],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
        self.processes["demo"] = process
        deadline = time.monotonic() + timeout
        self.passwords = read_passwords(process, deadline)
        if len(self.passwords) < len(DEMO_ACCOUNTS):
            self.stop()
            raise RuntimeError(f"demo printed no password for every account; see {log.name}")
        drain(process.stdout, log)
        wait_until(lambda: _healthy(self.url), max(1.0, deadline - time.monotonic()), "demo")
        return self

    # -- plumbing -----------------------------------------------------------------------

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        """Start ``args`` (its own session) as the process ``name``, logging to ``name.log``."""
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

    def terminate(self, name: str, sig: int = signal.SIGTERM) -> None:
        process = self.processes.pop(name, None)
        if process is not None:
            terminate(process, 15, sig, group=name == "demo")

    def run_python(self, *args: str, timeout: float = 300) -> str:
        """``python *args`` in the stack's environment; its output (raises on failure)."""
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

    def manage(self, *args: str, timeout: float = 120) -> str:
        """A management command against the stack's database; its output."""
        return self.run_python("manage.py", *args, timeout=timeout)

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

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
        """Every agent (and what it ran), every process, the scratch database."""
        for agent in self.agents:
            agent.kill()
            agent.remove_workloads()
        # Told to stop all at once, then waited for (one by one, each would wait out the
        # others' shutdown); Redis last, so that no worker stops while retrying its broker.
        last = [self.processes.pop("redis")] if "redis" in self.processes else []
        demo = self.processes.pop("demo", None)
        if demo is not None:
            terminate(demo, 10, group=True)
        terminate_all(list(self.processes.values()), 15)
        self.processes.clear()
        terminate_all(last, 15)
        if self.db_created:
            drop_database(self.server_url, self.db_name)
            self.db_created = False


def _server_name(index: int) -> str:
    return "daphne" if index == 0 else f"daphne-{index}"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
