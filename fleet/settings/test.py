"""Test settings: the base settings, a fast password hasher, and a private data directory.

``FLEET_DATABASE_URL`` and ``FLEET_REDIS_URL`` still apply, so the same suite runs on the
embedded defaults and on PostgreSQL + Redis.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from fleet.settings.base import *  # noqa: F403
from fleet.settings.base import DATABASES, FLEET_DATA_DIR
from fleet.settings.env import env, env_bool

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
