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


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(autouse=True)
def _logs_when_failed(request) -> Iterator[None]:
    """A failed end-to-end test prints the tail of every process's log of its stack (the
    server, workers, beat, agents): a failure on a loaded CI machine explains itself."""
    yield
    report = getattr(request.node, "report_call", None)
    if report is None or not report.failed or "stack" not in request.fixturenames:
        return
    running = request.getfixturevalue("stack")
    logs = sorted(running.workdir.glob("*.log")) + [a.dir / "agent.log" for a in running.agents]
    for path in logs:
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-40:]
            print(f"\n----- {path.name} ({path.parent.name}), last {len(tail)} lines -----")
            print("\n".join(tail))
