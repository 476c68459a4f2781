"""Fleet settings. Everything comes from ``FLEET_*`` environment variables.

Embedded mode (the default): SQLite, the in-memory channel layer, Celery tasks run in-process.
Production mode (``FLEET_MODE=production``): PostgreSQL from ``FLEET_DATABASE_URL``, Redis from
``FLEET_REDIS_URL`` for the channel layer and the Celery broker; a missing secret stops the start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from fleet.settings.env import env, env_bool, env_float, env_int, env_list, require

# Lets admin.ModelAdmin[Model] and friends be subscripted at run time, as the type stubs expect.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent.parent

FLEET_MODE = env("FLEET_MODE", "embedded")
if FLEET_MODE not in {"embedded", "production"}:
    raise ImproperlyConfigured(f"FLEET_MODE must be 'embedded' or 'production', got {FLEET_MODE!r}")
PRODUCTION = FLEET_MODE == "production"

if PRODUCTION:
    SECRET_KEY = require("FLEET_SECRET_KEY")
    DATABASE_URL = require("FLEET_DATABASE_URL")
    REDIS_URL = require("FLEET_REDIS_URL")
    ALLOWED_HOSTS = env_list("FLEET_ALLOWED_HOSTS", []) or require("FLEET_ALLOWED_HOSTS").split(",")
    DEBUG = env_bool("FLEET_DEBUG", False)
else:
    # Embedded mode only ever listens on loopback; this key protects nothing else.
    SECRET_KEY = env("FLEET_SECRET_KEY", "fleet-embedded-insecure-key-change-me-in-production")
    DATABASE_URL = env("FLEET_DATABASE_URL", "")
    REDIS_URL = env("FLEET_REDIS_URL", "")
    ALLOWED_HOSTS = env_list(
        "FLEET_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"]
    )
    DEBUG = env_bool("FLEET_DEBUG", False)

FLEET_DATA_DIR = Path(env("FLEET_DATA_DIR", str(BASE_DIR / "var")))

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "fleet.core",
    "fleet.inventory",
    "fleet.partitioning",
    "fleet.allocations",
    "fleet.api",
    "fleet.web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "fleet.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "fleet.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
else:
    FLEET_DATA_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(FLEET_DATA_DIR / "fleet.sqlite3"),
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = FLEET_DATA_DIR / "static"
# WhiteNoise serves static files in every mode; outside production it reads them from the apps
# directly, so the embedded mode needs no collectstatic.
WHITENOISE_USE_FINDERS = not PRODUCTION
WHITENOISE_AUTOREFRESH = not PRODUCTION
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the dashboard's JavaScript reads it to send X-CSRFToken
SESSION_COOKIE_SECURE = PRODUCTION and env_bool("FLEET_SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
CSRF_TRUSTED_ORIGINS = env_list("FLEET_CSRF_TRUSTED_ORIGINS", [])

REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fleet.core.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["fleet.core.permissions.RolePermission"],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "fleet.api.pagination.BoundedPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "fleet.core.errors.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
if DEBUG:
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append(
        "rest_framework.renderers.BrowsableAPIRenderer"
    )

SPECTACULAR_SETTINGS = {
    "TITLE": "Fleet API",
    "DESCRIPTION": (
        "Inventory, MIG layouts, MPS policies, deployments and placements of a fleet of NVIDIA "
        "GPU hosts. Authenticate with `Authorization: Token <key>` (scripts) or a session "
        "(browser). Every error is `{code, message, details}`."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI comes from the drf-spectacular-sidecar package (PyPI), never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "ENUM_NAME_OVERRIDES": {
        "HostStatusEnum": "fleet.inventory.models.HostStatus",
        "SharingModeEnum": "fleet.inventory.models.SharingMode",
        "GpuHealthEnum": "fleet.inventory.models.GpuHealth",
        "PartitionKindEnum": "fleet.partitioning.models.PartitionKind",
        "OperationKindEnum": "fleet.partitioning.models.OperationKind",
        "OperationStatusEnum": "fleet.partitioning.models.OperationStatus",
        "RequestKindEnum": "fleet.allocations.models.RequestKind",
        "AllocationStateEnum": "fleet.allocations.models.AllocationState",
        "DeploymentStatusEnum": ["pending", "partial", "placed"],
    },
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums"],
}

# Channels: Redis in production, in-memory in the embedded mode (one process).
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # redis-py's asyncio pool raises (does not wait) past max_connections (default
                # 100): hundreds of agent sockets re-joining their groups at once exceed it.
                "hosts": [
                    {
                        "address": REDIS_URL,
                        "max_connections": env_int("FLEET_REDIS_MAX_CONNECTIONS", 2000),
                    }
                ],
                "capacity": env_int("FLEET_CHANNEL_CAPACITY", 1000),
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": env_int("FLEET_CHANNEL_CAPACITY", 1000)},
        }
    }

# Celery: the Redis broker in production; tasks run in-process in the embedded mode.
CELERY_BROKER_URL = REDIS_URL or "memory://localhost/"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

CELERY_BEAT_SCHEDULE = {
    "redeliver": {"task": "fleet.redeliver", "schedule": env_float("FLEET_REDELIVER_EVERY", 2.0)},
    "expire-operations": {"task": "fleet.expire_operations", "schedule": 10.0},
    "mark-offline-hosts": {"task": "fleet.mark_offline_hosts", "schedule": 5.0},
    "recover-quiet-gpus": {"task": "fleet.recover_quiet_gpus", "schedule": 10.0},
    "advance-drains": {"task": "fleet.advance_drains", "schedule": 3.0},
    "retry-replicas": {"task": "fleet.retry_replicas", "schedule": 10.0},
    "telemetry-rollup": {"task": "fleet.telemetry_rollup", "schedule": 60.0},
    "telemetry-retention": {"task": "fleet.telemetry_retention", "schedule": 3600.0},
}

# Delivery of desired state to agents.
FLEET_PUSH_RETRY_SECONDS = env_float("FLEET_PUSH_RETRY_SECONDS", 5.0)
FLEET_OPERATION_TIMEOUT_SECONDS = env_float("FLEET_OPERATION_TIMEOUT_SECONDS", 300.0)
FLEET_HEARTBEAT_SECONDS = env_float("FLEET_HEARTBEAT_SECONDS", 1.0)
FLEET_OFFLINE_AFTER_MISSED = env_int("FLEET_OFFLINE_AFTER_MISSED", 10)
FLEET_XID_RECOVERY_SECONDS = env_float("FLEET_XID_RECOVERY_SECONDS", 300.0)

# Telemetry: the hot store's 1 s window, how long per-minute means are kept, how long a
# process caches a host's GPU map, and the agent sockets' batch window (fleet.live.ingest).
FLEET_TELEMETRY_RAW_SECONDS = env_int("FLEET_TELEMETRY_RAW_SECONDS", 3600)
FLEET_TELEMETRY_KEEP_SECONDS = env_int("FLEET_TELEMETRY_KEEP_SECONDS", 7 * 86400)
FLEET_TELEMETRY_GPU_CACHE_SECONDS = env_float("FLEET_TELEMETRY_GPU_CACHE_SECONDS", 60.0)
FLEET_LIVE_BATCH_SECONDS = env_float("FLEET_LIVE_BATCH_SECONDS", 0.1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("FLEET_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "celery.app.trace": {"level": env("FLEET_TASK_LOG_LEVEL", "WARNING")},
    },
}
