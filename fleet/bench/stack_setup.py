"""How a :class:`~fleet.bench.stack.Stack` gets going: the prepared template database of the
production mode, the environment and the printed passwords of the embedded mode."""

from __future__ import annotations

import atexit
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO

from fleet.bench.processes import create_database, drop_database

ROOT = Path(__file__).resolve().parents[2]
DEMO_ACCOUNTS = ("admin", "operator", "viewer")


def embedded_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of the embedded mode: SQLite and everything in-process, whatever
    FLEET_DATABASE_URL and FLEET_REDIS_URL the caller's environment holds."""
    env = {
        **os.environ,
        "FLEET_DATA_DIR": str(data_dir),
        "DJANGO_SETTINGS_MODULE": "fleet.settings.base",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    env.pop("FLEET_DATABASE_URL", None)
    env.pop("FLEET_REDIS_URL", None)
    return env


def read_passwords(process: subprocess.Popen[str], deadline: float) -> dict[str, str]:
    assert process.stdout is not None
    passwords: dict[str, str] = {}
    while time.monotonic() < deadline and len(passwords) < len(DEMO_ACCOUNTS):
        line = process.stdout.readline()
        if not line:
            break
        found = re.search(rf"({'|'.join(DEMO_ACCOUNTS)})\s+password: (\S+)", line)
        if found:
            passwords[found.group(1)] = found.group(2)
    return passwords


def drain(source: IO[str] | None, sink: IO[str]) -> None:
    """Copy the rest of a process's output to its log, so a full pipe never stalls it."""

    def copy() -> None:
        assert source is not None
        for line in source:
            sink.write(line)
            sink.flush()

    threading.Thread(target=copy, daemon=True).start()


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What every :meth:`Stack.up` of a process starts from: a migrated database holding an
    operator's and an admin's API token (a stack's own database is a copy of it: PostgreSQL's
    ``CREATE DATABASE ... TEMPLATE`` takes a tenth of a second, ``migrate`` four), and the
    collected static files (linked into each stack's data directory)."""

    database: str
    static: Path
    operator_token: str
    admin_token: str


_PREPARED: dict[str, Prepared] = {}


def prepared_database(server_url: str, env: dict[str, str]) -> Prepared:
    """The process's :class:`Prepared` on the PostgreSQL server ``server_url``, made once
    (with a stack's environment ``env``, its Redis running) and dropped when the process
    exits."""
    found = _PREPARED.get(server_url)
    if found is not None:
        return found
    name = f"fleet_e2e_template_{uuid.uuid4().hex[:10]}"
    data = Path(tempfile.mkdtemp(prefix="fleet-e2e-prepared-"))
    create_database(server_url, name)
    atexit.register(shutil.rmtree, data, True)
    atexit.register(drop_database, server_url, name)
    env = {**env, "FLEET_DATABASE_URL": f"{server_url}/{name}", "FLEET_DATA_DIR": str(data)}

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
    _PREPARED[server_url] = found
    return found
