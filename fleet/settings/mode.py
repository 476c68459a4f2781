"""The deployment mode and what it decides: the secrets, the database and Redis URLs, the
allowed hosts, debug, and the data directory.

Embedded mode (the default): SQLite, the in-memory channel layer, Celery tasks run in-process.
Production mode (``FLEET_MODE=production``): PostgreSQL from ``FLEET_DATABASE_URL``, Redis from
``FLEET_REDIS_URL`` for the channel layer and the Celery broker; a missing secret stops the start.
"""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from fleet.settings.env import env, env_bool, env_list, require
from fleet.settings.secret_key import embedded_secret_key, embedded_secrets_key, fernet_keys

BASE_DIR = Path(__file__).resolve().parent.parent.parent
# The dashboard's templates/ and static/: beside the fleet package in a checkout, in
# fleet/assets/ once installed from a wheel (setup.py copies them there).
ASSETS_DIR = (
    BASE_DIR
    if (BASE_DIR / "templates").is_dir()
    else Path(__file__).resolve().parent.parent / "assets"
)

FLEET_MODE = env("FLEET_MODE", "embedded")
if FLEET_MODE not in {"embedded", "production"}:
    raise ImproperlyConfigured(f"FLEET_MODE must be 'embedded' or 'production', got {FLEET_MODE!r}")
PRODUCTION = FLEET_MODE == "production"

if PRODUCTION:
    SECRET_KEY = require("FLEET_SECRET_KEY")
    _secrets_key = require("FLEET_SECRETS_KEY")
    DATABASE_URL = require("FLEET_DATABASE_URL")
    REDIS_URL = require("FLEET_REDIS_URL")
    ALLOWED_HOSTS = env_list("FLEET_ALLOWED_HOSTS", []) or require("FLEET_ALLOWED_HOSTS").split(",")
    if env_bool("FLEET_DEBUG", False):
        # Debug pages show settings, source and SQL to anyone who can make a request fail.
        raise ImproperlyConfigured(
            "FLEET_DEBUG=true is refused when FLEET_MODE=production: debug pages expose settings "
            "and code. Unset it, or debug in the embedded mode."
        )
    DEBUG = False
else:
    # Generated once per data directory (below) unless FLEET_SECRET_KEY is set.
    SECRET_KEY = env("FLEET_SECRET_KEY", "")
    _secrets_key = env("FLEET_SECRETS_KEY", "")
    DATABASE_URL = env("FLEET_DATABASE_URL", "")
    REDIS_URL = env("FLEET_REDIS_URL", "")
    ALLOWED_HOSTS = env_list(
        "FLEET_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"]
    )
    DEBUG = env_bool("FLEET_DEBUG", False)

FLEET_DATA_DIR = Path(env("FLEET_DATA_DIR", str(BASE_DIR / "var")))
if not SECRET_KEY:
    SECRET_KEY = embedded_secret_key(FLEET_DATA_DIR)
# Team secrets at rest (fleet.core.secrets): Fernet keys, the first encrypts, all decrypt (add a
# new key first, re-encrypt with `manage.py secrets_key --rotate`, then drop the old one).
FLEET_SECRETS_KEYS = (
    fernet_keys(_secrets_key) if _secrets_key else embedded_secrets_key(FLEET_DATA_DIR)
)
