"""What Fleet talks to beside its agents: alert webhooks, container registries (image digest
pinning) and the endpoint gateways."""

from __future__ import annotations

from fleet.settings.env import env, env_bool, env_float, env_int, env_list

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

# Endpoints (fleet.endpoints): the URL callers reach the gateways at (its scheme, host and port;
# a deployment's endpoint URL adds its path, or its host name); the backends each gateway's
# HAProxy declares in advance, one per endpoint (changing it needs the gateways restarted).
FLEET_GATEWAY_URL = env("FLEET_GATEWAY_URL", "") or None
FLEET_GATEWAY_SLOTS = env_int("FLEET_GATEWAY_SLOTS", 256)
