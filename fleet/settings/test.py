"""Test settings: the base settings, a fast password hasher, and a private data directory.

``FLEET_DATABASE_URL`` and ``FLEET_REDIS_URL`` still apply, so the same suite runs on the
embedded defaults and on PostgreSQL + Redis.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

# Under pytest-xdist each worker process gets its own Redis database (the URL's index plus the
# worker's number), as pytest-django gives each its own test database: the cache (throttles,
# load level), the channel layer's groups and the broker are then not shared between workers.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and os.environ.get("FLEET_REDIS_URL"):
    _url = re.match(r"^(.*?)(?:/(\d+))?/?$", os.environ["FLEET_REDIS_URL"])
    if _url is not None:
        _index = int(_url.group(2) or 0) + int(_WORKER[2:])
        os.environ["FLEET_REDIS_URL"] = f"{_url.group(1)}/{_index}"

from fleet.settings.base import *  # noqa: E402, F403
from fleet.settings.base import DATABASES, FLEET_DATA_DIR  # noqa: E402
from fleet.settings.env import env, env_bool  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    FLEET_DATA_DIR = Path(tempfile.mkdtemp(prefix="fleet-test-"))
    DATABASES["default"]["NAME"] = str(FLEET_DATA_DIR / "fleet-test.sqlite3")
    DATABASES["default"]["TEST"] = {"NAME": str(FLEET_DATA_DIR / "fleet-test.sqlite3")}

# In-process tests run tasks eagerly; tests that need a real worker start one (marked e2e).
CELERY_TASK_ALWAYS_EAGER = True

# Tests name made-up images and talk to loopback only: no registry is asked unless a test turns
# pinning on (against its own registry stub on loopback).
FLEET_IMAGE_PINNING = env_bool("FLEET_IMAGE_PINNING", False)

# Two suites on one PostgreSQL server (two checkouts, two developers) each name their own test
# database; pytest-django creates and drops it.
if not DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    _test_name = env("FLEET_TEST_DATABASE_NAME", "")
    if _test_name:
        DATABASES["default"]["TEST"] = {"NAME": _test_name}
