"""Starting the real processes on loopback: shared by ``bench_live`` and the end-to-end tests."""

from __future__ import annotations

import base64
import contextlib
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


# What a poll may meet before the thing it waits for exists: a server not listening yet
# (``URLError``, ``ConnectionError``: both ``OSError``), an answer without the key or row yet.
TRANSIENT: tuple[type[BaseException], ...] = (OSError, KeyError, IndexError)


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "",
    *,
    every: float = 0.2,
    transient: tuple[type[BaseException], ...] = TRANSIENT,
) -> Any:
    """Poll ``predicate`` until it returns something truthy (which is returned); an exception
    in ``transient`` is only "not yet". The one polling loop of the benchmarks and the tests.

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
    what = what or getattr(predicate, "__qualname__", repr(predicate))
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}: last={last!r}")


def terminate(
    process: subprocess.Popen[Any],
    timeout: float = 15,
    sig: int = signal.SIGTERM,
    *,
    group: bool = False,
) -> None:
    """Stop a child process: ``sig`` first, a kill if it does not exit in ``timeout`` seconds
    (``group``: to its whole process group, which it leads: what it started goes with it)."""
    if process.poll() is not None and not group:
        return

    def send(signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(process.pid, signum)
            else:
                process.send_signal(signum)

    send(sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait(5)


def terminate_all(
    processes: list[subprocess.Popen[Any]], timeout: float = 15, sig: int = signal.SIGTERM
) -> None:
    """Stop child processes together: ``sig`` to each, then up to ``timeout`` seconds for all
    of them to exit, a kill for those that did not."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
    deadline = time.monotonic() + timeout
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
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
