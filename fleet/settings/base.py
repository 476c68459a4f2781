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

from fleet.settings.env import env, env_bool, env_float, env_floats, env_int, env_list, require
from fleet.settings.secret_key import embedded_secret_key, embedded_secrets_key, fernet_keys

# Lets admin.ModelAdmin[Model] and friends be subscripted at run time, as the type stubs expect.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent.parent

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
    "fleet.endpoints",
    "fleet.autoscaling",
    "fleet.api",
    "fleet.web",
    "fleet.commands",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "fleet.core.middleware.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "fleet.core.middleware.LoginLockoutMiddleware",
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
                "fleet.web.context_processors.mass_offline",
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
SESSION_COOKIE_AGE = env_int("FLEET_SESSION_SECONDS", 12 * 3600)
# Messages live in the session, not in a signed (readable) cookie: the admin shows one-time
# enrollment tokens as messages.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

# HTTPS. HSTS is sent on HTTPS responses only (behind a TLS-terminating load balancer, set
# FLEET_SECURE_PROXY_SSL_HEADER so Django knows a request came over HTTPS).
SECURE_HSTS_SECONDS = env_int("FLEET_HSTS_SECONDS", 365 * 86400 if PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("FLEET_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("FLEET_HSTS_PRELOAD", False)
SECURE_SSL_REDIRECT = env_bool("FLEET_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # load balancers probe over plain HTTP
_proxy_ssl = env_list("FLEET_SECURE_PROXY_SSL_HEADER", [])
if _proxy_ssl and len(_proxy_ssl) != 2:
    raise ImproperlyConfigured(
        "FLEET_SECURE_PROXY_SSL_HEADER must be 'HEADER,value', e.g. 'HTTP_X_FORWARDED_PROTO,https'"
    )
SECURE_PROXY_SSL_HEADER = (_proxy_ssl[0], _proxy_ssl[1]) if _proxy_ssl else None
# check --deploy warns when these are off; they are the operator's choice, not a default:
# includeSubDomains and preload bind every host of the domain, and TLS usually ends (and
# redirects) at the load balancer (FLEET_SSL_REDIRECT makes Fleet redirect too).
SILENCED_SYSTEM_CHECKS = ["security.W005", "security.W021", "security.W008"]

# Scripts only from our own origin (the templates have no inline script and no event handler
# attribute); inline styles stay allowed for the grid placements in style="" attributes.
FLEET_CONTENT_SECURITY_POLICY = env(
    "FLEET_CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; "
    "form-action 'self'",
)

# Sign-in lockout (fleet.core.login_throttle), failed sign-ins kept for the admins, API tokens.
FLEET_LOGIN_FREE_FAILURES = env_int("FLEET_LOGIN_FREE_FAILURES", 5)
FLEET_LOGIN_MAX_LOCKOUT_SECONDS = env_int("FLEET_LOGIN_MAX_LOCKOUT_SECONDS", 900)
FLEET_LOGIN_FAILURES_KEEP_DAYS = env_int("FLEET_LOGIN_FAILURES_KEEP_DAYS", 30)
FLEET_MAX_API_TOKENS_PER_USER = env_int("FLEET_MAX_API_TOKENS_PER_USER", 50)


def _throttle_rate(name: str, default: str) -> str:
    """A DRF rate such as ``120/min`` from ``name``; a malformed one stops the start."""
    rate = env(name, default)
    count, _, period = rate.partition("/")
    if not (count.isdecimal() and period[:1] in {"s", "m", "h", "d"}):
        raise ImproperlyConfigured(f"{name} must look like 120/min (per s, min, hour or day)")
    return rate


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
    "DEFAULT_SCHEMA_CLASS": "fleet.api.schema.LimitedAutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "fleet.api.negotiation.Negotiation",
    "DEFAULT_PARSER_CLASSES": ["fleet.api.parsers.JsonParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # Throttles (fleet.api.limits): per user, per agent host, per client address, and per view
    # scope. Rates are "<count>/<s|min|hour|day>"; the defaults leave people and scripts alone
    # and stop a loop. The client address is the NUM_PROXIES-th from the right of
    # X-Forwarded-For (0: the socket's peer; set it to the number of reverse proxies).
    "DEFAULT_THROTTLE_CLASSES": [
        "fleet.api.limits.UserThrottle",
        "fleet.api.limits.AgentThrottle",
        "fleet.api.limits.AnonThrottle",
        "fleet.api.limits.ScopedThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "user": _throttle_rate("FLEET_THROTTLE_USER", "1200/min"),
        "agent": _throttle_rate("FLEET_THROTTLE_AGENT", "600/min"),
        "anon": _throttle_rate("FLEET_THROTTLE_ANON", "120/min"),
        "enroll": _throttle_rate("FLEET_THROTTLE_ENROLL", "30/min"),
        "mig": _throttle_rate("FLEET_THROTTLE_MIG", "300/min"),
        "expensive": _throttle_rate("FLEET_THROTTLE_EXPENSIVE", "60/min"),
    },
    "NUM_PROXIES": env_int("FLEET_NUM_PROXIES", 0),
}
if DEBUG:
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append(
        "rest_framework.renderers.BrowsableAPIRenderer"
    )

# Throttle counters live in the cache: Redis when there is one, so that every ASGI process counts
# together; process memory in the embedded mode (one process). Short socket timeouts: a throttle
# lets requests through when Redis is unreachable, and must not wait long to find out.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "fleet",
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Request bodies: the ASGI cap on any request (fleet.api.limits.BodySizeLimit, before Django
# spools it), then the JSON parsers' caps (fleet.api.parsers). Behind a reverse proxy, set its
# own cap (nginx client_max_body_size) to FLEET_MAX_REQUEST_BYTES or less.
FLEET_MAX_REQUEST_BYTES = env_int("FLEET_MAX_REQUEST_BYTES", 8 * 1024 * 1024)
FLEET_MAX_JSON_BYTES = env_int("FLEET_MAX_JSON_BYTES", 1024 * 1024)
FLEET_MAX_ENROLL_BYTES = env_int("FLEET_MAX_ENROLL_BYTES", 64 * 1024)
FLEET_MAX_REPORT_BYTES = env_int("FLEET_MAX_REPORT_BYTES", 4 * 1024 * 1024)

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
    # The schema and the docs are for users holding a role, like the API they describe.
    "SERVE_PERMISSIONS": ["fleet.core.permissions.RolePermission"],
    "ENUM_NAME_OVERRIDES": {
        "HostStatusEnum": "fleet.inventory.models.HostStatus",
        "SharingModeEnum": "fleet.inventory.models.SharingMode",
        "AgentRuntimeEnum": "fleet.inventory.models.AgentRuntime",
        "WorkloadRuntimeEnum": ["container", "process", "none"],
        "GpuHealthEnum": "fleet.inventory.models.GpuHealth",
        "PartitionKindEnum": "fleet.partitioning.models.PartitionKind",
        "OperationKindEnum": "fleet.core.models.OperationKind",
        "OperationStatusEnum": "fleet.core.models.OperationStatus",
        "RequestKindEnum": "fleet.allocations.models.RequestKind",
        "AllocationStateEnum": "fleet.allocations.models.AllocationState",
        "DeploymentStatusEnum": "fleet.allocations.states.DeploymentStatus",
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
                # redis-py 8 times socket reads out after 5 s by default, exactly channels-redis'
                # 5 s BZPOPMIN: reads then time out at random and drop sockets
                # (django/channels_redis#422). A longer timeout still finds a dead Redis.
                "hosts": [
                    {
                        "address": REDIS_URL,
                        "max_connections": env_int("FLEET_REDIS_MAX_CONNECTIONS", 2000),
                        "socket_timeout": 15,
                        "socket_connect_timeout": 5,
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
    # A run that waited past the next one is dropped: runs piled up behind a stopped worker must
    # not evict (or record a mass offline) side by side.
    "mark-offline-hosts": {
        "task": "fleet.mark_offline_hosts",
        "schedule": 5.0,
        "options": {"expires": 5.0},
    },
    "recover-quiet-gpus": {"task": "fleet.recover_quiet_gpus", "schedule": 10.0},
    "advance-workflows": {"task": "fleet.advance_workflows", "schedule": 3.0},
    # Autoscaling's evaluation (fleet.autoscaling); a run that waited past the next is dropped.
    "autoscale": {
        "task": "fleet.autoscale",
        "schedule": env_float("FLEET_AUTOSCALE_SECONDS", 5.0),
        "options": {"expires": env_float("FLEET_AUTOSCALE_SECONDS", 5.0)},
    },
    "retry-replicas": {"task": "fleet.retry_replicas", "schedule": 10.0},
    "telemetry-rollup": {"task": "fleet.telemetry_rollup", "schedule": 60.0},
    "telemetry-retention": {"task": "fleet.telemetry_retention", "schedule": 3600.0},
    "prune-login-failures": {"task": "fleet.prune_login_failures", "schedule": 3600.0},
    "prune-health-events": {"task": "fleet.prune_health_events", "schedule": 3600.0},
    "retry-alerts": {"task": "fleet.retry_alerts", "schedule": 5.0},
    "prune-alert-deliveries": {"task": "fleet.prune_alert_deliveries", "schedule": 3600.0},
}

# Delivery of desired state to agents.
FLEET_PUSH_RETRY_SECONDS = env_float("FLEET_PUSH_RETRY_SECONDS", 5.0)
FLEET_OPERATION_TIMEOUT_SECONDS = env_float("FLEET_OPERATION_TIMEOUT_SECONDS", 300.0)
# A move's new copy must run within this, or the move is rolled back (the old copy stays).
FLEET_MOVE_TIMEOUT_SECONDS = env_float("FLEET_MOVE_TIMEOUT_SECONDS", 300.0)
# A rolling update's new copy counts once it has stayed running this long (minReadySeconds).
FLEET_ROLLOUT_MIN_READY_SECONDS = env_int("FLEET_ROLLOUT_MIN_READY_SECONDS", 10)
# CP-SAT's wall-clock limit for a repack proposal (the greedy plan answers past it).
FLEET_REPACK_TIME_LIMIT_SECONDS = env_float("FLEET_REPACK_TIME_LIMIT_SECONDS", 3.0)
# The layout advisor (GET /api/v1/capacity/advice, operators) runs CP-SAT for up to 10 s: one
# solve per user per this many seconds (0: no limit), and one at a time per server process.
FLEET_ADVICE_MIN_INTERVAL_SECONDS = env_float("FLEET_ADVICE_MIN_INTERVAL_SECONDS", 30.0)
# How many layout-advisor solves may run at once in one server process (each uses 8 threads).
FLEET_ADVISOR_CONCURRENCY = env_int("FLEET_ADVISOR_CONCURRENCY", 1)
FLEET_HEARTBEAT_SECONDS = env_float("FLEET_HEARTBEAT_SECONDS", 1.0)
FLEET_OFFLINE_AFTER_MISSED = env_int("FLEET_OFFLINE_AFTER_MISSED", 10)
FLEET_XID_RECOVERY_SECONDS = env_float("FLEET_XID_RECOVERY_SECONDS", 300.0)
# Unreachable is not failed (fleet.workflows.offline): an offline host's
# replicas keep their places this long (Kubernetes' default toleration, 300 s); nothing is evicted
# while more than this share of enrolled hosts is offline (its --unhealthy-zone-threshold); and
# at most this share of a GPU product's hosts (one below 10 hosts) has its replicas re-placed per
# window (its --node-eviction-rate, counted per product as it counts per zone).
FLEET_EVICT_OFFLINE_AFTER_SECONDS = env_float("FLEET_EVICT_OFFLINE_AFTER_SECONDS", 300.0)
FLEET_MASS_OFFLINE_FRACTION = env_float("FLEET_MASS_OFFLINE_FRACTION", 0.55)
FLEET_EVICT_RATE_FRACTION = env_float("FLEET_EVICT_RATE_FRACTION", 0.2)
FLEET_EVICT_RATE_WINDOW_SECONDS = env_float("FLEET_EVICT_RATE_WINDOW_SECONDS", 60.0)

# Telemetry: the hot store's 1 s window, how long per-minute means are kept, how long a
# process caches a host's GPU map, and the agent sockets' batch window (fleet.live.ingest).
FLEET_TELEMETRY_RAW_SECONDS = env_int("FLEET_TELEMETRY_RAW_SECONDS", 3600)
FLEET_TELEMETRY_KEEP_SECONDS = env_int("FLEET_TELEMETRY_KEEP_SECONDS", 7 * 86400)
FLEET_TELEMETRY_GPU_CACHE_SECONDS = env_float("FLEET_TELEMETRY_GPU_CACHE_SECONDS", 60.0)
FLEET_LIVE_BATCH_SECONDS = env_float("FLEET_LIVE_BATCH_SECONDS", 0.25)
# Past its capacity an ASGI process coarsens telemetry instead of falling behind
# (fleet.live.load): agents are asked to report every N s at the "busy" and "overloaded" levels.
FLEET_LIVE_DEGRADE = env_bool("FLEET_LIVE_DEGRADE", True)
FLEET_LIVE_DEGRADED_INTERVALS = env_floats(
    "FLEET_LIVE_DEGRADED_INTERVALS", (2.0, 3.0), low=1.0, high=10.0
)
# The ASGI server's young-generation collection threshold (fleet.asgi; Python's default: 700).
FLEET_GC_THRESHOLD = env_int("FLEET_GC_THRESHOLD", 10_000)
# How long an ASGI process trusts a host token it has checked (new sockets skip the database).
FLEET_AGENT_AUTH_CACHE_SECONDS = env_float("FLEET_AGENT_AUTH_CACHE_SECONDS", 10.0)
# Host tokens (fleet.agents.host_tokens) expire FLEET_HOST_TOKEN_DAYS after they are issued; an
# agent that connects (or reports over REST) with less than FLEET_HOST_TOKEN_RENEW_DAYS left is
# sent a new one. Fractions of a day are allowed.
FLEET_HOST_TOKEN_DAYS = env_float("FLEET_HOST_TOKEN_DAYS", 90.0)
FLEET_HOST_TOKEN_RENEW_DAYS = env_float("FLEET_HOST_TOKEN_RENEW_DAYS", 30.0)
if not 0 <= FLEET_HOST_TOKEN_RENEW_DAYS < FLEET_HOST_TOKEN_DAYS:
    # A window as long as the lifetime would renew the token at every connection.
    raise ImproperlyConfigured(
        "FLEET_HOST_TOKEN_RENEW_DAYS must be at least 0 and less than FLEET_HOST_TOKEN_DAYS, "
        f"got {FLEET_HOST_TOKEN_RENEW_DAYS} and {FLEET_HOST_TOKEN_DAYS}"
    )

# What one agent may send (fleet.agents.guard): GPUs per host, bytes per message (daphne's own
# WebSocket limit is the same 1 MiB by default: --websocket-max-message-size), and how long
# health events are kept.
FLEET_AGENT_MAX_GPUS = env_int("FLEET_AGENT_MAX_GPUS", 64)
FLEET_AGENT_MAX_MESSAGE_BYTES = env_int("FLEET_AGENT_MAX_MESSAGE_BYTES", 1024 * 1024)
DAPHNE_WEBSOCKET_MAX_MESSAGE_SIZE = FLEET_AGENT_MAX_MESSAGE_BYTES  # manage.py runserver
FLEET_HEALTH_EVENTS_KEEP_DAYS = env_int("FLEET_HEALTH_EVENTS_KEEP_DAYS", 30)

# Alert webhooks (fleet.core.webhooks): one POST per attempt within this timeout (the whole
# attempt: connect, TLS, request and answer); a failed attempt is tried again after
# FLEET_ALERT_RETRY_SECONDS, doubling each time (at most an hour), until
# FLEET_ALERT_MAX_ATTEMPTS; the delivery log is kept FLEET_ALERT_DELIVERIES_KEEP_DAYS.
# Private, loopback, link-local (cloud metadata), unspecified and multicast destinations are
# refused unless FLEET_WEBHOOK_ALLOW_PRIVATE (a receiver on the internal network).
FLEET_ALERT_TIMEOUT_SECONDS = env_float("FLEET_ALERT_TIMEOUT_SECONDS", 5.0)
FLEET_WEBHOOK_ALLOW_PRIVATE = env_bool("FLEET_WEBHOOK_ALLOW_PRIVATE", False)
FLEET_ALERT_RETRY_SECONDS = env_float("FLEET_ALERT_RETRY_SECONDS", 10.0)
FLEET_ALERT_MAX_ATTEMPTS = env_int("FLEET_ALERT_MAX_ATTEMPTS", 8)
FLEET_ALERT_DELIVERIES_KEEP_DAYS = env_int("FLEET_ALERT_DELIVERIES_KEEP_DAYS", 30)

# Image digest pinning (fleet.core.registry): a container's tag is resolved to its digest when a
# deployment is created or its workload changes, within FLEET_IMAGE_RESOLVE_TIMEOUT_SECONDS in
# all; where no registry answers, the tag is kept and the reason recorded. Private, loopback
# and link-local registries are not asked unless FLEET_IMAGE_REGISTRY_ALLOW_PRIVATE; registries
# in FLEET_IMAGE_REGISTRY_INSECURE (host[:port]) are asked over plain HTTP.
FLEET_IMAGE_PINNING = env_bool("FLEET_IMAGE_PINNING", True)
FLEET_IMAGE_RESOLVE_TIMEOUT_SECONDS = env_float("FLEET_IMAGE_RESOLVE_TIMEOUT_SECONDS", 3.0)
FLEET_IMAGE_REGISTRY_ALLOW_PRIVATE = env_bool("FLEET_IMAGE_REGISTRY_ALLOW_PRIVATE", False)
FLEET_IMAGE_REGISTRY_INSECURE = env_list("FLEET_IMAGE_REGISTRY_INSECURE", [])

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

# Endpoints (fleet.endpoints): the URL callers reach the gateways at (its scheme, host and port;
# a deployment's endpoint URL adds its path, or its host name); the backends each gateway's
# HAProxy declares in advance, one per endpoint (changing it needs the gateways restarted).
FLEET_GATEWAY_URL = env("FLEET_GATEWAY_URL", "") or None
FLEET_GATEWAY_SLOTS = env_int("FLEET_GATEWAY_SLOTS", 256)
