"""Fleet's image (Dockerfile), as deploy/container/check.sh builds it: its
``migrate``, ``web`` and ``worker`` roles run against this machine's PostgreSQL (a scratch
database) and Redis (db 15) with the host's network; the login page and the static files
(collected into the image, served by WhiteNoise) answer, an agent enrols (simulated GPU) and a
replica is placed and applied. Runs where FLEET_IMAGE names the built image (check.sh sets it)."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_install import Client, free_port, wait_operation, wait_until

IMAGE = os.environ.get("FLEET_IMAGE", "")
PG = os.environ.get("FLEET_IMAGE_TEST_PG", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("FLEET_IMAGE_TEST_REDIS", "redis://127.0.0.1:6379/15")
DATABASE = "fleet_image_ci"
LABEL = "fleet.test=image"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not IMAGE or shutil.which("docker") is None,
        reason="FLEET_IMAGE: the image deploy/container/check.sh built",
    ),
]


def psql(sql: str) -> None:
    subprocess.run(["psql", PG, "-qc", sql], capture_output=True, timeout=60, check=False)


def scratch_reset() -> None:
    subprocess.run(
        [
            "bash",
            "-c",
            f'ids=$(docker ps -aq --filter label={LABEL}); [ -z "$ids" ] || docker rm -f $ids',
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    psql(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
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


class Deployment:
    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-image-"))
        self.env = {
            "FLEET_SECRET_KEY": secrets.token_urlsafe(50),
            "FLEET_SECRETS_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "FLEET_DATABASE_URL": PG.rsplit("/", 1)[0] + f"/{DATABASE}",
            "FLEET_REDIS_URL": REDIS,
            "FLEET_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "FLEET_PORT": str(self.port),
            "FLEET_BIND": "127.0.0.1",
        }
        self.agent: subprocess.Popen[bytes] | None = None

    def docker(self, *args: str, detach: bool = False) -> str:
        env = [f"--env={k}={v}" for k, v in self.env.items()]
        command = ["docker", "run", "--network=host", f"--label={LABEL}", *env]
        command += (
            ["--detach", f"--name=fleet-image-{uuid.uuid4().hex[:8]}"] if detach else ["--rm"]
        )
        done = subprocess.run(
            [*command, IMAGE, *args], capture_output=True, text=True, timeout=180, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip()

    def logs(self) -> str:
        found = subprocess.run(
            [
                "bash",
                "-c",
                f"for id in $(docker ps -aq --filter label={LABEL}); do "
                "echo ---- $id; docker logs --tail 60 $id 2>&1; done",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        agent = self.dir / "agent.log"
        return found.stdout + (agent.read_text(errors="replace")[-3000:] if agent.exists() else "")


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    scratch_reset()
    psql(f"CREATE DATABASE {DATABASE}")
    found = Deployment()
    try:
        yield found
    finally:
        if found.agent is not None:
            found.agent.kill()
            found.agent.wait(10)
        scratch_reset()
        shutil.rmtree(found.dir, ignore_errors=True)


def test_the_image_migrates_serves_enrols_and_places(deployment: Deployment) -> None:
    deployment.docker("migrate", "-v0")
    deployment.docker("web", detach=True)
    deployment.docker("worker", "--concurrency", "1", detach=True)
    client = Client(f"http://127.0.0.1:{deployment.port}")
    client.token = deployment.docker("manage", "create_api_token", "admin", "--role", "admin")
    try:
        status, page = wait_until(lambda: client.get("/login/"), 60, "the image's login page")
        assert status == 200 and 'name="csrfmiddlewaretoken"' in page
        static = re.search(r'(/static/[^"]+\.css)', page)
        assert static, page
        assert client.get(static.group(1))[0] == 200  # collected into the image, WhiteNoise

        status, host = client.api("POST", "/api/v1/hosts/", {"name": "gpu-host-image"})
        assert status == 201, host
        from fleet.inventory.simulation import simulated_spec
        from fleet.mig import product_by_key

        spec = deployment.dir / "gpus.json"
        spec.write_text(
            json.dumps({"seed": 2, "gpus": [simulated_spec(product_by_key("a30-24gb"))]})
        )
        agent = Path(sys.executable).parent / "fleet-agent"
        deployment.agent = subprocess.Popen(
            [
                str(agent),
                "--server",
                client.base,
                "--enroll",
                host["enrollment_token"],
                "--token-file",
                str(deployment.dir / "token.json"),
                "--simulate",
                str(spec),
                "--allow-mutation",
                "--runtime",
                "none",
                "--mps-dir",
                str(deployment.dir / "mps"),
            ],
            stdout=(deployment.dir / "agent.log").open("ab"),
            stderr=subprocess.STDOUT,
        )

        def gpus() -> list[dict[str, Any]]:
            status, body = client.api("GET", f"/api/v1/gpus/?host={host['id']}")
            return list(body["results"]) if status == 200 else []

        (gpu,) = wait_until(gpus, 60, "the enrolled agent's GPU")
        status, op = client.api(
            "PUT", f"/api/v1/gpus/{gpu['id']}/layout", {"mode": "mps", "mps": {}}
        )
        assert status == 202, op
        wait_operation(client, op["id"])
        status, created = client.api(
            "POST",
            "/api/v1/deployments/",
            {"name": "asr", "kind": "mps", "memory_mib": 4096, "replicas": 1},
        )
        assert status == 201, created
        status, op = client.api(
            "POST", f"/api/v1/deployments/{created['id']}/place", {"gpu": gpu["id"]}
        )
        assert status == 202, op
        wait_operation(client, op["id"])
    except BaseException:
        print(deployment.logs())
        raise


def test_the_image_runs_the_gateway_role_with_its_haproxy(deployment: Deployment) -> None:
    """The ``gateway`` role: ``fleet_gateway`` starts the image's HAProxy as its child and keeps
    it in step with the endpoints; with none routed yet, HAProxy itself answers on the listen
    port with the gateway's own 404 (``endpoint.not_found``), and its Prometheus exporter."""
    listen, metrics = free_port(), free_port()
    deployment.docker(
        "gateway",
        "--listen",
        f"127.0.0.1:{listen}",
        "--metrics",
        f"127.0.0.1:{metrics}",
        detach=True,
    )

    def answer() -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{listen}/", timeout=5) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read()

    try:
        status, body = wait_until(answer, 60, "the gateway's HAProxy")
        assert status == 404 and json.loads(body)["code"] == "endpoint.not_found", body
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as page:
            assert b"haproxy_process_" in page.read()
    except BaseException:
        print(deployment.logs())
        raise
