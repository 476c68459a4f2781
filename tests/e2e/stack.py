"""The real product on loopback for end-to-end tests: PostgreSQL (a scratch database on the
server FLEET_DATABASE_URL names), a private Redis, the ASGI server (daphne), a Celery worker and
beat, and simulated agents as separate ``fleet-agent`` processes."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet.bench import processes
from fleet.bench.processes import free_port
from fleet.inventory.simulation import simulated_spec
from fleet.mig import product_by_key

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# The user the tests' workloads run as (processes and containers): non-root, as a policy wants.
NOBODY = "65534:65534"


def wait_until(
    predicate: Callable[[], Any], timeout: float = 30.0, every: float = 0.25, what: str = ""
) -> Any:
    """Poll until truthy; an unreachable server or a missing key is just "not yet"."""
    return processes.wait_until(
        predicate,
        timeout,
        what or str(predicate),
        every=every,
        transient=(urllib.error.URLError, ConnectionError, OSError, KeyError, IndexError),
    )


def remove_containers(host_name: str) -> None:
    """Remove the containers a test agent of ``host_name`` started (when Docker answers)."""
    if shutil.which("docker") is None:
        return
    found = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=fleet.host={host_name}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    ids = found.stdout.split() if found.returncode == 0 else []
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=120)


class Agent:
    def __init__(self, stack: Stack, name: str, products: list[str]) -> None:
        self.stack, self.name, self.products = stack, name, products
        self.dir = stack.tmp / f"agent-{name}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.token_file = self.dir / "token.json"
        self.faults = self.dir / "faults"
        specs = [simulated_spec(product_by_key(k)) for k in products]  # type: ignore[arg-type]
        (self.dir / "gpus.json").write_text(
            json.dumps({"seed": abs(hash(name)) % 10_000, "gpus": specs})
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(
        self,
        enrollment_token: str | None = None,
        hostname: str | None = None,
        transport: str = "ws",
        runtime: str | None = None,
    ) -> Agent:
        args = [
            str(BIN / "fleet-agent"),
            "--server",
            self.stack.url,
            "--token-file",
            str(self.token_file),
            "--simulate",
            str(self.dir / "gpus.json"),
            "--allow-mutation",
            "--interval",
            "0.5",
            "--hostname",
            hostname or self.name,
            "--fault-dir",
            str(self.faults),
            "--mps-dir",
            str(self.dir / "mps"),
        ]
        if enrollment_token:
            args += ["--enroll", enrollment_token]
        args += ["--transport", transport]
        if runtime is not None:
            args += ["--runtime", runtime, "--state-dir", str(self.dir / "workloads")]
            # The tests' processes run as the test's user; their images are built locally.
            args += ["--allow-process-runtime", "--process-as-agent-user"]
            args += ["--image-pull", "if-not-present"]
        log = (self.dir / "agent.log").open("ab")
        self.process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=self.stack.env
        )
        return self

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def remove_workloads(self) -> None:
        """Stop what this agent ran: its workloads outlive it by design (an agent restart must
        not stop them), so a test run would leave them behind, and a container named after
        this host and an allocation id would collide with the next run's."""
        state = self.dir / "workloads" / "processes.json"
        try:
            table = json.loads(state.read_text()).get("processes", {})
        except (OSError, ValueError, AttributeError):
            table = {}
        for entry in table.values() if isinstance(table, dict) else []:
            pid = entry.get("pid") if isinstance(entry, dict) else None
            if isinstance(pid, int) and pid > 1:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
        remove_containers(self.name)

    def fault(self, **command: Any) -> dict[str, Any]:
        name = f"{uuid.uuid4().hex}.json"
        self.faults.mkdir(parents=True, exist_ok=True)
        # Written aside, then renamed: the agent never reads a half-written file.
        staging = self.faults / f".{name}.tmp"
        staging.write_text(json.dumps(command))
        staging.rename(self.faults / name)
        done = self.faults / name.replace(".json", ".done")
        wait_until(done.exists, 10, what=f"fault {command}")
        return dict(json.loads(done.read_text()))

    def log(self) -> str:
        return (self.dir / "agent.log").read_text(errors="replace")


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What every stack of a test session starts from: a migrated database holding an
    operator's and an admin's API token (a stack's own database is a copy of it: PostgreSQL's
    ``CREATE DATABASE ... TEMPLATE`` takes a tenth of a second, ``migrate`` four), and the
    collected static files (linked into each stack's data directory)."""

    database: str
    static: Path
    operator_token: str
    admin_token: str


_PREPARED: dict[str, Prepared] = {}


def _prepared(stack: Stack) -> Prepared:
    """The session's :class:`Prepared` on ``stack``'s PostgreSQL server, made once (with
    ``stack``'s Redis) and dropped when the test process exits."""
    found = _PREPARED.get(stack.server_url)
    if found is not None:
        return found
    name = f"fleet_e2e_template_{uuid.uuid4().hex[:10]}"
    data = Path(tempfile.mkdtemp(prefix="fleet-e2e-prepared-"))
    processes.create_database(stack.server_url, name)
    atexit.register(shutil.rmtree, data, True)
    atexit.register(processes.drop_database, stack.server_url, name)
    env = {**stack.env, "FLEET_DATABASE_URL": f"{stack.server_url}/{name}"}
    env["FLEET_DATA_DIR"] = str(data)

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed: {done.stderr}")
        return done.stdout

    manage("migrate", "-v0")
    manage("collectstatic", "--noinput", "-v0")
    found = Prepared(
        database=name,
        static=data / "static",
        operator_token=manage("create_api_token", "ops", "--role", "operator").strip(),
        admin_token=manage("create_api_token", "root", "--role", "admin").strip(),
    )
    _PREPARED[stack.server_url] = found
    return found


class Stack:
    def __init__(self, tmp: Path, database_url: str, *, servers: int = 1, workers: int = 1) -> None:
        self.tmp = tmp
        self.redis_port = free_port()
        self.http_ports = [free_port() for _ in range(servers)]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.http_ports]
        self.url = self.urls[0]
        self.worker_count = workers
        self.db_name = f"fleet_e2e_{uuid.uuid4().hex[:10]}"
        self.server_url = database_url.rsplit("/", 1)[0]
        self.env = processes.production_env(
            f"{self.server_url}/{self.db_name}",
            self.redis_port,
            tmp / "data",
            FLEET_PUSH_RETRY_SECONDS="1",
            FLEET_REDELIVER_EVERY="1",
            FLEET_IMAGE_PINNING="false",  # test images are local: no registry is asked
        )
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.agents: list[Agent] = []

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> Stack:
        self.start_redis()
        prepared = _prepared(self)
        processes.create_database(self.server_url, self.db_name, template=prepared.database)
        (self.tmp / "data").mkdir(parents=True, exist_ok=True)
        (self.tmp / "data" / "static").symlink_to(prepared.static)
        self.operator_token, self.admin_token = prepared.operator_token, prepared.admin_token
        for i, port in enumerate(self.http_ports):
            name = "daphne" if i == 0 else f"daphne-{i}"
            daphne = [
                str(BIN / "daphne"),
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "fleet.asgi:application",
            ]
            self.spawn(name, daphne)
        for _ in range(self.worker_count):
            self.start_worker()
        beat = [
            str(BIN / "celery"),
            "-A",
            "fleet",
            "beat",
            "-l",
            "warning",
            "-s",
            str(self.tmp / "beat-schedule"),
        ]
        self.spawn("beat", beat)
        for url in self.urls:
            wait_until(
                lambda url=url: self.get("/healthz", token=None, base=url)["status"] == "ok",
                30,
                what=f"the ASGI server {url}",
            )
        self.allow_workloads()
        return self

    def allow_workloads(self, team: str = "default") -> None:
        """The tests' team may run processes (as ``nobody``) and containers on the host's
        network (their health checks reach 127.0.0.1), as an admin's policy would allow;
        the restricted default is what tests/e2e/test_tenancy.py checks."""
        status, teams = self.request("GET", "/api/v1/teams/", token="admin")
        assert status == 200, teams
        found = next((t for t in teams["results"] if t["slug"] == team), None)
        if found is None:
            status, found = self.request("POST", "/api/v1/teams/", {"name": team}, token="admin")
            assert status == 201, found
        status, policy = self.request(
            "PUT",
            f"/api/v1/teams/{found['id']}/policy",
            {"runtimes": ["container", "process"], "process_user": NOBODY, "host_network": True},
            token="admin",
        )
        assert status == 200, policy

    def stop(self) -> None:
        for agent in self.agents:
            agent.kill()
            agent.remove_workloads()
        for name in list(self.processes):
            self.terminate(name)
        processes.drop_database(self.server_url, self.db_name)

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("ab")
        process = subprocess.Popen(
            args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.processes[name] = process
        return process

    def terminate(self, name: str, sig: int = signal.SIGTERM) -> None:
        process = self.processes.pop(name, None)
        if process is not None:
            processes.terminate(process, 15, sig)

    def start_redis(self) -> None:
        self.spawn("redis", processes.redis_command(self.redis_port))
        wait_until(lambda: processes.redis_ping(self.redis_port), 10, what="redis")

    def restart_redis(self) -> None:
        self.terminate("redis", signal.SIGKILL)
        self.start_redis()

    def stop_server(self, index: int = 0) -> None:
        """Stop one ASGI server (an upgrade, a crash): its agent and browser sockets drop."""
        self.terminate("daphne" if index == 0 else f"daphne-{index}")

    def start_server(self, index: int = 0) -> float:
        """Start a stopped ASGI server again on its port; returns ``time.monotonic()`` at the
        moment it answers ``/healthz``."""
        port, url = self.http_ports[index], self.urls[index]
        self.spawn(
            "daphne" if index == 0 else f"daphne-{index}",
            [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "fleet.asgi:application"],
        )
        wait_until(
            lambda: self.get("/healthz", token=None, base=url)["status"] == "ok",
            30,
            every=0.1,
            what=f"the ASGI server {url} back",
        )
        return time.monotonic()

    def start_worker(self) -> None:
        name = f"worker-{uuid.uuid4().hex[:6]}"
        worker = [
            str(BIN / "celery"),
            "-A",
            "fleet",
            "worker",
            "--pool=solo",
            "-l",
            "warning",
            "-n",
            f"{name}@%h",
        ]
        self.spawn(name, worker)

    def kill_worker(self) -> None:
        """SIGKILL every worker: tasks in flight are lost as in a crash."""
        for name in [n for n in self.processes if n.startswith("worker")]:
            self.terminate(name, signal.SIGKILL)

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed: {result.stderr}")
        return result.stdout

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    # -- API ----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = "operator",
        base: str | None = None,
    ) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if token:  # "operator", "admin", or a token of its own (a team member's, say)
            named = {"admin": self.admin_token, "operator": self.operator_token}
            headers["Authorization"] = f"Token {named.get(token, token)}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            (base or self.url) + path, data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(req, timeout=15) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def team_user(self, username: str) -> tuple[int, str]:
        """A user with no fleet role (only a team's role, once an admin gives one): its id and
        an API token."""
        made = self.manage(
            "shell",
            "-c",
            "from django.contrib.auth import get_user_model; "
            f"print(get_user_model().objects.create_user({username!r}).pk)",
        )
        user_id = int(made.strip().splitlines()[-1])
        return user_id, self.manage("create_api_token", username).strip()

    def raw(self, method: str, path: str, token: str = "operator") -> bytes:
        """The answer's bytes (a CSV export, say)."""
        named = {"admin": self.admin_token, "operator": self.operator_token}
        req = urllib.request.Request(
            self.url + path,
            method=method,
            headers={"Authorization": f"Token {named.get(token, token)}"},
        )
        with urllib.request.urlopen(req, timeout=15) as response:
            return bytes(response.read())

    def get(self, path: str, token: str | None = "operator", base: str | None = None) -> Any:
        status, body = self.request("GET", path, token=token, base=base)
        assert status == 200, (path, status, body)
        return body

    def add_agent(
        self, name: str, products: list[str], transport: str = "ws", runtime: str | None = None
    ) -> Agent:
        remove_containers(name)  # left by an earlier run that was interrupted
        status, host = self.request("POST", "/api/v1/hosts/", {"name": name}, token="admin")
        assert status == 201, host
        agent = Agent(self, name, products).start(
            enrollment_token=host["enrollment_token"], transport=transport, runtime=runtime
        )
        agent.runtime = runtime  # type: ignore[attr-defined]
        self.agents.append(agent)
        agent.host_id = host["id"]  # type: ignore[attr-defined]
        wait_until(
            lambda: self.get(f"/api/v1/gpus/?host={host['id']}")["count"] == len(products),
            30,
            what=f"{name}'s GPUs",
        )
        return agent

    def gpus(self, agent: Agent) -> list[dict[str, Any]]:
        return sorted(
            self.get(f"/api/v1/gpus/?host={agent.host_id}")["results"], key=lambda g: g["index"]
        )  # type: ignore[attr-defined]

    def operation(self, op_id: int) -> dict[str, Any]:
        return dict(self.get(f"/api/v1/operations/{op_id}/"))

    def wait_operation(self, op_id: int, timeout: float = 30) -> dict[str, Any]:
        return dict(
            wait_until(
                lambda: (
                    (op := self.operation(op_id))["status"] in ("succeeded", "failed", "expired")
                    and op
                ),
                timeout,
                what=f"operation {op_id}",
            )
        )

    def converged(self, gpu_id: int) -> bool:
        """The GPU as its agent observes it equals its desired layout."""
        gpu = self.get(f"/api/v1/gpus/{gpu_id}/")
        partitions = self.get(f"/api/v1/partitions/?gpu={gpu_id}")["results"]
        desired = sorted((p["profile_id"], p["start"]) for p in partitions if p["kind"] == "mig")
        observed = gpu["observed"]
        seen = sorted((i["profile_id"], i["start"]) for i in observed.get("mig_instances", []))
        mig_ok = (
            bool(observed.get("mig_mode_current")) == (gpu["mode"] == "mig")
            if gpu["mig_capable"]
            else True
        )
        mps_wanted = any(p["mps_enabled"] for p in partitions)
        mps_ok = (
            bool(observed.get("mps", {}).get("running")) == mps_wanted
            if gpu["mode"] != "mig"
            else True
        )
        return desired == seen and mig_ok and mps_ok

    def browser_session(self, base: str, username: str = "watcher", role: str = "viewer") -> str:
        """Log a user in through the login page of ``base``; returns the Cookie header value."""
        import http.cookiejar
        import re

        password = "e2e-" + uuid.uuid4().hex
        self.manage(
            "shell",
            "-c",
            "from fleet.core.services import user_create; from fleet.core.roles import Role; "
            f"user_create(username={username!r}, password={password!r}, role=Role.{role.upper()})",
        )
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        page = opener.open(base + "/login/", timeout=10).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token, "no CSRF token on the login page"
        form = urllib.parse.urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": token.group(1)}
        )
        opener.open(
            urllib.request.Request(
                base + "/login/", data=form.encode(), headers={"Referer": base + "/login/"}
            ),
            timeout=10,
        )
        cookies = {c.name: c.value for c in jar}
        assert "sessionid" in cookies, "login failed"
        return "; ".join(f"{k}={v}" for k, v in cookies.items())


def running(stack: Stack, deployment_id: int) -> int:
    """The deployment's replicas whose workload runs (the API's ``running_replicas``)."""
    return int(stack.get(f"/api/v1/deployments/{deployment_id}/")["running_replicas"])


class Watch:
    """The deployment's running count, sampled every 50 ms while a move, drain or rollout
    happens (make before break: its minimum is the count before)."""

    def __init__(self, stack: Stack, deployment_id: int) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(stack, deployment_id))

    def _run(self, stack: Stack, deployment_id: int) -> None:
        while not self._stop.is_set():
            self.samples.append(running(stack, deployment_id))
            time.sleep(0.05)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
