"""Each test starts with no sign-in failures counted (the cache outlives a test)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_login_failures_counted():
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()
