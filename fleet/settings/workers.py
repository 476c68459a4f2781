"""What the processes share through Redis in production: the cache (throttle counters), the
channel layer and Celery (the broker, the beat schedule); in-process in the embedded mode."""

from __future__ import annotations

from fleet.settings.env import env_float, env_int
from fleet.settings.mode import REDIS_URL

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
    # Reclaim (docs/sharing.md): a deserved share taken back from borrowers, one at a time;
    # a run that waited past the next is dropped.
    "reclaim": {
        "task": "fleet.reclaim",
        "schedule": env_float("FLEET_RECLAIM_EVERY_S", 3.0),
        "options": {"expires": env_float("FLEET_RECLAIM_EVERY_S", 3.0)},
    },
    "retry-replicas": {"task": "fleet.retry_replicas", "schedule": 10.0},
    # The queue (docs/sharing.md): waiting replicas of auto-placed deployments placed as
    # capacity frees, in queue order; a run that waited past the next one is dropped.
    "place-queue": {
        "task": "fleet.place_queue",
        "schedule": env_float("FLEET_QUEUE_PLACE_EVERY_S", 5.0),
        "options": {"expires": env_float("FLEET_QUEUE_PLACE_EVERY_S", 5.0)},
    },
    # What would it take? for every waiting replica, recomputed when the fleet changed
    # (fleet.sharing.wit); a run that waited past the next one is dropped.
    "wit-refresh": {
        "task": "fleet.wit_refresh",
        "schedule": env_float("FLEET_WIT_REFRESH_SECONDS", 5.0),
        "options": {"expires": env_float("FLEET_WIT_REFRESH_SECONDS", 5.0)},
    },
    "telemetry-rollup": {"task": "fleet.telemetry_rollup", "schedule": 60.0},
    "telemetry-retention": {"task": "fleet.telemetry_retention", "schedule": 3600.0},
    "prune-login-failures": {"task": "fleet.prune_login_failures", "schedule": 3600.0},
    "prune-health-events": {"task": "fleet.prune_health_events", "schedule": 3600.0},
    "retry-alerts": {"task": "fleet.retry_alerts", "schedule": 5.0},
    "prune-alert-deliveries": {"task": "fleet.prune_alert_deliveries", "schedule": 3600.0},
    # Single sign-on: LDAP users gone from the directory lose their tokens (fleet.core.sso).
    "sso-ldap-sync": {
        "task": "fleet.sso_ldap_sync",
        "schedule": float(env_int("FLEET_LDAP_SYNC_SECONDS", 300)),
    },
}

# Autoscaling: at most this many replicas added by one scale-out (or a doubling, when that is
# more: fleet.autoscaling.rule); unset or 0: no limit.
FLEET_AUTOSCALE_MAX_STEP_OUT: int | None = env_int("FLEET_AUTOSCALE_MAX_STEP_OUT", 0) or None
