from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.stack import Stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    database_url = os.environ.get("FLEET_DATABASE_URL", "")
    if not database_url.startswith("postgres"):
        pytest.skip(
            "end-to-end tests need PostgreSQL: set FLEET_DATABASE_URL (and FLEET_REDIS_URL)"
        )
    if not shutil.which("redis-server"):
        pytest.skip("end-to-end tests start their own Redis: redis-server is not installed")
    running = Stack(tmp_path_factory.mktemp("stack"), database_url)
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A directory the tests' workloads can write to: they run as ``nobody``
    (:data:`tests.e2e.stack.NOBODY`), as a team policy wants, not as the test's user."""
    path = Path(tempfile.mkdtemp(prefix="fleet-e2e-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)
