from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.stack import launched


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with launched(tmp_path_factory.mktemp("stack")) as running:
        yield running


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A directory the tests' workloads can write to: they run as ``nobody``
    (:data:`tests.e2e.stack.NOBODY`), as a team policy wants, not as the test's user."""
    path = Path(tempfile.mkdtemp(prefix="fleet-e2e-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)
