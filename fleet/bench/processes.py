"""Starting the real processes on loopback: shared by ``bench_live`` and the end-to-end tests."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    *,
    every: float = 0.2,
    transient: tuple[type[BaseException], ...] = (OSError,),
) -> Any:
    """Poll ``predicate`` until it returns something truthy (which is returned).

    Raises:
        AssertionError: after ``timeout`` seconds, naming ``what`` and the last outcome.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except transient as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}: last={last!r}")


def terminate(
    process: subprocess.Popen[bytes], timeout: float = 15, sig: int = signal.SIGTERM
) -> None:
    """Stop a child process: ``sig`` first, a kill if it does not exit in ``timeout`` seconds."""
    if process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def redis_command(port: int) -> list[str]:
    """A throwaway Redis on loopback that keeps nothing on disk."""
    redis = shutil.which("redis-server") or "redis-server"
    return [redis, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]


def redis_ping(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")


def create_database(server_url: str, name: str, *, template: str | None = None) -> None:
    """A scratch PostgreSQL database on ``server_url`` (a ``postgres://`` URL without the db),
    empty or a copy of ``template`` (a database nobody is connected to)."""
    import psycopg

    copy = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{copy}')


def drop_database(server_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def production_env(
    database_url: str, redis_port: int, data_dir: Path, **extra: str
) -> dict[str, str]:
    """The environment of a stack's processes: production mode on the given PostgreSQL database
    and private Redis, on loopback (``extra``: more ``FLEET_*`` settings)."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "fleet.settings.base",
        "FLEET_MODE": "production",
        "FLEET_SECRET_KEY": "stack-" + uuid.uuid4().hex,
        "FLEET_SECRETS_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "FLEET_DATABASE_URL": database_url,
        "FLEET_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "FLEET_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "FLEET_SECURE_COOKIES": "false",
        "FLEET_DATA_DIR": str(data_dir),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
