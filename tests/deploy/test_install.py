"""deploy/install.sh and hostagent/packaging/install.sh, end to end on this machine, as root,
under a scratch prefix, database and Redis database: Fleet is installed twice (idempotent: the
keys and the admin are kept), its units' processes are started from their ExecStart lines
(tests/deploy/unit_runner.py: no systemd as PID 1 here), Caddy serves the installed
configuration, and through it the login page answers, the printed admin login signs in, the
static files are served, an agent installed by its own script enrols over TLS (simulated GPUs)
and a replica is placed and applied.

It installs packages when they are missing and a ``fleet`` system user: it runs only where
FLEET_INSTALL_TEST=1 (.ci/run sets it), as root. FLEET_INSTALL_TEST_PG (a superuser URL) and
FLEET_INSTALL_TEST_REDIS say which servers to use."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENABLED = os.environ.get("FLEET_INSTALL_TEST") == "1" and os.geteuid() == 0
PG = os.environ.get("FLEET_INSTALL_TEST_PG", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("FLEET_INSTALL_TEST_REDIS", "redis://127.0.0.1:6379/14")
DATABASE = "fleet_install_ci"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not ENABLED, reason="FLEET_INSTALL_TEST=1 and root only (.ci/run)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (OSError, urllib.error.URLError, KeyError, IndexError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


class Install:
    """A scratch installation: its directories, ports and processes."""

    def __init__(self) -> None:
        # Under /tmp itself, 0755: the fleet user reads the release and its venv.
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-install-", dir="/tmp"))
        self.dir.chmod(0o755)
        self.web_ports = [free_port(), free_port()]
        self.http_port, self.https_port = free_port(), free_port()
        self.base = f"https://localhost:{self.https_port}"
        self.processes: list[subprocess.Popen[bytes]] = []

    def script(self) -> list[str]:
        return [
            "bash",
            str(ROOT / "deploy" / "install.sh"),
            "--no-systemd",
            "--hostname",
            "localhost",
            "--proxy",
            "caddy",
            "--tls-internal",
            "--http-port",
            str(self.http_port),
            "--https-port",
            str(self.https_port),
            "--web-ports",
            ",".join(map(str, self.web_ports)),
            "--prefix",
            str(self.dir / "opt"),
            "--etc",
            str(self.dir / "etc"),
            "--state-root",
            str(self.dir / "var"),
            "--unit-dir",
            str(self.dir / "units"),
            "--bin-dir",
            str(self.dir / "bin"),
            "--proxy-config",
            str(self.dir / "Caddyfile"),
            "--database",
            DATABASE,
            "--pg-admin-url",
            PG,
            "--redis-url",
            REDIS,
        ]

    def run(self, args: list[str]) -> str:
        done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def start(self, args: list[str], log: str, env: dict[str, str] | None = None) -> None:
        out = (self.dir / log).open("ab")
        self.processes.append(subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env))

    def runner(self, unit_dir: str, *units: str) -> None:
        self.start(
            [
                sys.executable,
                str(ROOT / "tests" / "deploy" / "unit_runner.py"),
                "--state-root",
                str(self.dir / "var"),
                str(self.dir / unit_dir),
                str(self.dir / "logs"),
                *units,
            ],
            f"runner-{unit_dir}.log",
        )

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(40)
            except subprocess.TimeoutExpired:
                process.kill()

    def logs(self) -> str:
        return "\n".join(
            f"---- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted([*self.dir.glob("*.log"), *self.dir.glob("logs/*.log")])
        )


def drop_scratch_state() -> None:
    for sql in (
        f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)",
        f"DROP ROLE IF EXISTS {DATABASE}",
    ):
        subprocess.run(["psql", PG, "-qc", sql], capture_output=True, timeout=60, check=False)
    url = urllib.parse.urlsplit(REDIS)
    subprocess.run(
        [
            "redis-cli",
            "-h",
            url.hostname or "127.0.0.1",
            "-p",
            str(url.port or 6379),
            "-n",
            url.path.strip("/") or "0",
            "flushdb",
        ],
        capture_output=True,
        timeout=30,
        check=False,
    )


@pytest.fixture(scope="module")
def install() -> Iterator[Install]:
    drop_scratch_state()
    scratch = Install()
    try:
        yield scratch
    except BaseException:
        raise
    finally:
        scratch.stop()
        if os.environ.get("FLEET_INSTALL_TEST_KEEP") != "1":
            shutil.rmtree(scratch.dir, ignore_errors=True)
            drop_scratch_state()


class Client:
    """HTTPS through the proxy, trusting Caddy's own CA, with a cookie jar."""

    def __init__(self, base: str, cafile: Path | None = None) -> None:
        self.base = base
        context = ssl.create_default_context(cafile=None if cafile is None else str(cafile))
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=context),
            urllib.request.HTTPCookieProcessor(self.jar),
        )
        self.token = ""

    def get(self, path: str) -> tuple[int, str]:
        with self.opener.open(self.base + path, timeout=15) as response:
            return response.status, response.read().decode(errors="replace")

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.base + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with self.opener.open(request, timeout=15) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")


def test_install_sh_installs_a_fleet_that_serves_enrols_and_places(install: Install) -> None:
    started = time.monotonic()
    first = install.run(install.script())
    login = re.search(r"admin login: user admin, password (\S+)", first)
    assert login, first
    env_file = install.dir / "etc" / "fleet.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    settings = env_file.read_text()
    # Again: the same keys, the same admin (its password is not reset), nothing new to do.
    second = install.run(install.script())
    assert env_file.read_text() == settings
    assert "admin login: user admin exists, password unchanged" in second, second
    print(f"install.sh twice: {time.monotonic() - started:.1f} s")

    # The installed wheel carries the templates and static files (no source tree on the path).
    venv_python = str(install.dir / "opt" / "venv" / "bin" / "python")
    found = subprocess.run(
        [venv_python, "-c", "import fleet.settings.mode as m; print(m.ASSETS_DIR)"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "FLEET_DATA_DIR": str(install.dir / "embedded")},
        check=False,
    )
    assets = Path(found.stdout.strip())
    assert found.returncode == 0, found.stderr
    assert "site-packages" in str(assets) and (assets / "templates" / "404.html").is_file()
    assert (assets / "static").is_dir()

    webs = [f"fleet-web@{port}.service" for port in install.web_ports]
    install.runner("units", *webs, "fleet-worker.service", "fleet-beat.service")
    caddy_home = install.dir / "caddy"
    caddy_env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(caddy_home),
        "XDG_DATA_HOME": str(caddy_home / "data"),
        "XDG_CONFIG_HOME": str(caddy_home / "config"),
    }
    install.start(
        ["caddy", "run", "--adapter", "caddyfile", "--config", str(install.dir / "Caddyfile")],
        "caddy.log",
        caddy_env,
    )
    root_cert = caddy_home / "data" / "caddy" / "pki" / "authorities" / "local" / "root.crt"
    wait_until(root_cert.exists, 30, "Caddy's CA")
    client = Client(install.base, root_cert)
    try:
        status, page = wait_until(lambda: client.get("/login/"), 60, "the login page via Caddy")
        assert status == 200 and 'name="csrfmiddlewaretoken"' in page

        # The static files the page names, through the proxy (Caddy serves them from disk).
        static = re.search(r'(/static/[^"]+\.css)', page)
        assert static, page
        assert client.get(static.group(1))[0] == 200

        # The admin login install.sh printed signs in.
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert csrf
        form = urllib.parse.urlencode(
            {"username": "admin", "password": login.group(1), "csrfmiddlewaretoken": csrf.group(1)}
        ).encode()
        client.opener.open(
            urllib.request.Request(
                install.base + "/login/", data=form, headers={"Referer": install.base + "/login/"}
            ),
            timeout=15,
        )
        assert "sessionid" in {c.name for c in client.jar}, "the printed admin login failed"

        # The operator's manage.py: fleet-manage, as the fleet user with fleet.env.
        client.token = subprocess.run(
            [
                str(install.dir / "bin" / "fleet-manage"),
                "create_api_token",
                "admin",
                "--name",
                "install-test",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.strip()
        status, host = client.api("POST", "/api/v1/hosts/", {"name": "gpu-host-1"})
        assert status == 201, host

        # The agent, by its own install script, enrols over TLS through the proxy.
        from fleet.inventory.simulation import simulated_spec
        from fleet.mig import product_by_key

        spec = install.dir / "gpus.json"
        spec.write_text(
            json.dumps({"seed": 1, "gpus": [simulated_spec(product_by_key("a30-24gb"))]})
        )
        agent_args = [
            "bash",
            str(ROOT / "hostagent" / "packaging" / "install.sh"),
            "--no-systemd",
            "--server",
            install.base,
            "--token",
            host["enrollment_token"],
            "--allow-mutation",
            "--set",
            f"FLEET_AGENT_SIMULATE={spec}",
            "--set",
            "FLEET_AGENT_RUNTIME=none",
            "--set",
            f"FLEET_AGENT_MPS_DIR={install.dir / 'mps'}",
            "--prefix",
            str(install.dir / "agent"),
            "--etc",
            str(install.dir / "agent-etc"),
            "--state-root",
            str(install.dir / "var"),
            "--unit-dir",
            str(install.dir / "agent-units"),
        ]
        install.run(agent_args)
        agent_env = install.dir / "agent-etc" / "agent.env"
        assert agent_env.stat().st_mode & 0o777 == 0o600
        assert "FLEET_AGENT_ALLOW_MUTATION=true" in agent_env.read_text()
        # This test's CA: Caddy's own (a real server has a certificate hosts trust already).
        with agent_env.open("a") as out:
            out.write(f"SSL_CERT_FILE={root_cert}\n")
        install.runner("agent-units", "fleet-workloads.service", "fleet-agent.service")

        def gpus() -> list[dict[str, Any]]:
            status, body = client.api("GET", f"/api/v1/gpus/?host={host['id']}")
            return list(body["results"]) if status == 200 else []

        (gpu,) = wait_until(gpus, 60, "the enrolled agent's GPU")
        status, op = client.api(
            "PUT", f"/api/v1/gpus/{gpu['id']}/layout", {"mode": "mps", "mps": {}}
        )
        assert status == 202, op
        wait_operation(client, op["id"])
        status, deployment = client.api(
            "POST",
            "/api/v1/deployments/",
            {"name": "asr", "kind": "mps", "memory_mib": 4096, "replicas": 1},
        )
        assert status == 201, deployment
        status, op = client.api(
            "POST", f"/api/v1/deployments/{deployment['id']}/place", {"gpu": gpu["id"]}
        )
        assert status == 202, op
        wait_operation(client, op["id"])

        def active() -> bool:
            _, rows = client.api("GET", f"/api/v1/allocations/?deployment={deployment['id']}")
            return [r["state"] for r in rows["results"]] == ["active"]

        wait_until(active, 30, "the placed replica active")
    except BaseException:
        print(install.logs())
        raise
    print(f"install, start, enrol and place: {time.monotonic() - started:.1f} s")


def wait_operation(client: Client, op_id: int) -> None:
    def done() -> dict[str, Any] | None:
        status, op = client.api("GET", f"/api/v1/operations/{op_id}/")
        return op if status == 200 and op["status"] in ("succeeded", "failed", "expired") else None

    op = wait_until(done, 60, f"operation {op_id}")
    assert op["status"] == "succeeded", op
