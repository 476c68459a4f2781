"""The real product on loopback for end-to-end tests: :class:`fleet.bench.stack.Stack` (the one
launcher of the benchmarks and the tests) in production mode, with what these tests add: a
scratch database on the PostgreSQL server FLEET_DATABASE_URL names (a copy of the session's
prepared template), a private Redis, the ASGI server (daphne), a Celery worker and beat,
fast retries, and the default team allowed to run workloads as ``nobody``."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.bench.processes import wait_until
from fleet.bench.stack import BIN, ROOT, Stack
from fleet.bench.stack_agent import Agent, remove_containers

__all__ = [
    "BIN",
    "NOBODY",
    "ROOT",
    "Agent",
    "Stack",
    "Watch",
    "e2e_stack",
    "launched",
    "remove_containers",
    "running",
    "wait_until",
]

# The user the tests' workloads run as (processes and containers): non-root, as a policy wants.
NOBODY = "65534:65534"
# The tests' team may run processes (as ``nobody``) and containers on the host's network (their
# health checks reach 127.0.0.1), as an admin's policy would allow; the restricted default is
# what tests/e2e/test_tenancy.py checks.
POLICY: dict[str, Any] = {
    "runtimes": ["container", "process"],
    "process_user": NOBODY,
    "host_network": True,
}
ENV = {
    "FLEET_PUSH_RETRY_SECONDS": "1",
    "FLEET_REDELIVER_EVERY": "1",
    "FLEET_IMAGE_PINNING": "false",  # test images are local: no registry is asked
}


def e2e_stack(
    tmp: Path,
    database_url: str,
    *,
    servers: int = 1,
    workers: int = 1,
    env: dict[str, str] | None = None,
) -> Stack:
    """A stack as the end-to-end tests want it (not started: call :meth:`Stack.up`);
    ``env``: more settings."""
    return Stack(
        tmp,
        database_url,
        servers=servers,
        workers=workers,
        env={**ENV, **(env or {})},
        workload_policy=POLICY,
        quiet=False,
        db_prefix="fleet_e2e",
    )


@contextlib.contextmanager
def launched(tmp: Path, **options: Any) -> Iterator[Stack]:
    """An :func:`e2e_stack` up for the ``with`` block, stopped after (the test skips without
    PostgreSQL or redis-server)."""
    database_url = os.environ.get("FLEET_DATABASE_URL", "")
    if not database_url.startswith("postgres"):
        pytest.skip(
            "end-to-end tests need PostgreSQL: set FLEET_DATABASE_URL (and FLEET_REDIS_URL)"
        )
    if not shutil.which("redis-server"):
        pytest.skip("end-to-end tests start their own Redis: redis-server is not installed")
    stack = e2e_stack(tmp, database_url, **options)
    try:
        yield stack.up()
    finally:
        stack.stop()


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
            time.sleep(0.05)  # the sampling period, not a wait

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
