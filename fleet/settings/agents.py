"""The agents: pushing desired state to them, heartbeats and when a quiet host is offline (and
its replicas evicted), host tokens, and what one agent may send."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from fleet.settings.env import env_float, env_int

# Delivery of desired state to agents.
FLEET_PUSH_RETRY_SECONDS = env_float("FLEET_PUSH_RETRY_SECONDS", 5.0)
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
