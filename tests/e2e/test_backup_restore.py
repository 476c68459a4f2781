"""Backups (issue 26): what docs/operations.md says to back up is enough. A populated fleet's
PostgreSQL database, dumped with ``pg_dump -Fc`` and restored with ``pg_restore`` into a fresh
database, is served by a new ASGI server given the same keys (FLEET_SECRET_KEY and
FLEET_SECRETS_KEY): the same hosts, GPUs, layouts, deployments and replicas, the same API
tokens, and no migration left to apply. Redis is not backed up (it holds the last hour of 1 s
telemetry, rebuilt as agents report)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from fleet.bench import processes
from fleet.bench.processes import free_port
from tests.e2e.stack import BIN, ROOT, Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def _pg(tool: str, *args: str) -> None:
    done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{tool} failed: {done.stderr}"


def populated(stack: Stack) -> dict[str, object]:
    agent = stack.add_agent("bk-1", ["h100-sxm5-80gb", "a100-sxm4-40gb"])
    gpus = stack.gpus(agent)
    layout = {"mode": "mig", "instances": [{"profile": "3g.40gb", "start": 0}]}
    status, op = stack.request("PUT", f"/api/v1/gpus/{gpus[0]['id']}/layout", layout)
    assert status == 202, op
    assert stack.wait_operation(op["id"])["status"] == "succeeded"
    body = {"name": "bk-dep", "replicas": 1, "kind": "mig", "profile": "3g.40gb"}
    status, created = stack.request("POST", "/api/v1/deployments/", body)
    assert status == 201, created
    target = {"gpu": gpus[0]["id"]}
    status, op = stack.request("POST", f"/api/v1/deployments/{created['id']}/place", target)
    assert status == 202 and stack.wait_operation(op["id"])["status"] == "succeeded", op
    return fleet_view(stack, stack.url)


def fleet_view(stack: Stack, base: str) -> dict[str, object]:
    """What the API says of the fleet (state, not live telemetry)."""

    def rows(path: str, *keys: str) -> list[tuple[object, ...]]:
        results = stack.get(path + "?limit=200", base=base)["results"]
        return sorted(tuple(r[k] for k in keys) for r in results)

    return {
        "hosts": rows("/api/v1/hosts/", "name", "agent_version", "desired_generation"),
        "gpus": rows("/api/v1/gpus/", "uuid", "mode"),
        "partitions": rows("/api/v1/partitions/", "gpu", "kind", "profile_name", "start"),
        "deployments": rows("/api/v1/deployments/", "name", "replicas", "status"),
        "allocations": rows("/api/v1/allocations/", "deployment", "partition", "state"),
    }


def test_a_pg_dump_of_a_populated_fleet_restored_into_a_fresh_database_is_served(stack, tmp_path):
    if not (shutil.which("pg_dump") and shutil.which("pg_restore")):
        pytest.fail("pg_dump and pg_restore (postgresql-client) are needed")
    before = populated(stack)
    dump = tmp_path / "fleet.dump"
    _pg("pg_dump", "-Fc", "-f", str(dump), f"{stack.server_url}/{stack.db_name}")
    restored = f"{stack.db_name}_restored"
    processes.create_database(stack.server_url, restored)
    try:
        _pg("pg_restore", "--no-owner", "-d", f"{stack.server_url}/{restored}", str(dump))
        env = {**stack.env, "FLEET_DATABASE_URL": f"{stack.server_url}/{restored}"}
        pending = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--check"], cwd=ROOT, env=env, timeout=60
        )
        assert pending.returncode == 0, "the restored database has migrations left to apply"
        port = free_port()
        log = (tmp_path / "daphne-restored.log").open("ab")
        server = subprocess.Popen(
            [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "fleet.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until(
                lambda: stack.get("/healthz", token=None, base=base)["status"] == "ok",
                30,
                what="the restored server",
            )
            after = fleet_view(stack, base)  # the same API tokens work on the restore
            assert after == before
            assert before["deployments"] and before["allocations"]
        finally:
            processes.terminate(server, 15)
    finally:
        processes.drop_database(stack.server_url, restored)
