"""Personas (viewer, operator, admin) and API clients for them.

Django-free suites (tests/mig, tests/mps, tests/placement, tests/hostagent) run with
``-p no:django``: nothing here may import Django or DRF at module level.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st


# Hypothesis builds its ``randoms()`` strategy from a module it imports on first use, which
# pytest's assertion rewriting (Hypothesis is a plugin) then compiles in the middle of a test.
# CPython 3.11 can refuse that compile with a spurious "AST constructor recursion depth
# mismatch" SystemError (cpython gh-106905), as CI saw once while agent threads ran beside it:
# build it once the session starts, before any test runs.
def pytest_sessionstart(session: pytest.Session) -> None:
    st.randoms().validate()


@pytest.fixture
def broker(monkeypatch):
    """A real broker's path (not eager), the task names sent recorded instead of delivered
    (``"NAME (in 1 s)"`` for a deferred one); the once-a-second kicks start unheld."""
    from django.core.cache import cache

    from fleet.celery import app
    from fleet.core.jobs import PLACE_QUEUE_KICK_KEY, RECLAIM_KICK_KEY

    sent: list[str] = []
    monkeypatch.setitem(app.conf, "task_always_eager", False)

    def send_task(name, args=None, countdown=None):
        sent.append(name if countdown is None else f"{name} (in {countdown} s)")

    monkeypatch.setattr(app, "send_task", send_task)
    keys = [PLACE_QUEUE_KICK_KEY, RECLAIM_KICK_KEY]
    keys += [f"{key}:deferred" for key in keys]
    cache.delete_many(keys)
    yield sent
    cache.delete_many(keys)


@pytest.fixture
def make_user(db):
    from fleet.core.roles import Role
    from fleet.core.services import user_create

    def make(role: str, username: str | None = None) -> Any:
        return user_create(
            username=username or f"{role}-user",
            password="s3cret-pass-word",
            role=Role[role.upper()],
        )

    return make


@pytest.fixture
def viewer(make_user):
    return make_user("viewer")


@pytest.fixture
def operator(make_user):
    return make_user("operator")


@pytest.fixture
def admin_user(make_user):
    return make_user("admin")


def _token_client(user: Any) -> Any:
    from rest_framework.test import APIClient

    from fleet.core.services import api_token_create

    _, secret = api_token_create(user=user, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    return client


@pytest.fixture
def anon_client() -> Any:
    from rest_framework.test import APIClient

    return APIClient()


@pytest.fixture
def viewer_client(viewer) -> Any:
    return _token_client(viewer)


@pytest.fixture
def operator_client(operator) -> Any:
    return _token_client(operator)


@pytest.fixture
def admin_client(admin_user) -> Any:
    return _token_client(admin_user)


@pytest.fixture(autouse=True)
def _fresh_throttles(request: pytest.FixtureRequest) -> None:
    """Each test starts with no request counted against its users' throttles. In the embedded
    runs (SQLite) user ids are reused after each test's rollback, so one test's calls would count
    against the next one's users; a process-local cache is cleared whole, cheaply. (On
    PostgreSQL ids are never reused, and the cache is Redis: left alone.)"""
    if not request.config.pluginmanager.hasplugin("django"):
        return  # -p no:django (the real-GPU checks, on a host without Django): no cache
    from django.core.cache import caches
    from django.core.cache.backends.locmem import LocMemCache

    backend = caches["default"]
    if isinstance(backend, LocMemCache):
        backend.clear()


@pytest.fixture(autouse=True)
def _fresh_telemetry_store(request):
    """Each Django test starts with an empty telemetry hot store (row ids are reused)."""
    if (
        "db" in request.fixturenames
        or "transactional_db" in request.fixturenames
        or request.node.get_closest_marker("django_db")
    ):
        from fleet.inventory.telemetry import get_store

        get_store().clear()


@pytest.fixture
def mem_store(settings: Any) -> Any:
    """The telemetry hot store in process memory (whatever FLEET_REDIS_URL says), emptied, and
    no GPU map cached from an earlier test."""
    from fleet.agents import ingest
    from fleet.inventory import telemetry

    settings.REDIS_URL = ""
    store = telemetry.get_store()
    store.clear()
    ingest.forget_all()
    yield store
    store.clear()


_PROCESS_SUITES = ("e2e", "bench")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Under pytest-xdist (``--dist loadgroup``), the tests that start real processes (a stack
    of servers, workers and agents) run one after another on one worker, as they would alone:
    their timings are what they assert. The rest spread over the other workers."""
    for item in items:
        parts = item.nodeid.split("/")
        if (len(parts) > 1 and parts[1] in _PROCESS_SUITES) or item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.xdist_group("processes"))
