"""Facts about an HTTP request that depend on the deployment (proxies in front of Fleet)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

MAX_ADDRESS_LENGTH = 64


def trusted_proxies() -> int:
    """How many proxies (load balancers) append to ``X-Forwarded-For`` in front of Fleet:
    DRF's ``NUM_PROXIES`` (``FLEET_NUM_PROXIES``); 0 unless configured."""
    configured = settings.REST_FRAMEWORK.get("NUM_PROXIES")
    if configured is None:
        configured = getattr(settings, "FLEET_NUM_PROXIES", 0)
    return max(0, int(configured or 0))


def client_address(request: Any) -> str:
    """The client's IP address, as DRF's throttles see it (``SimpleRateThrottle.get_ident``),
    except that ``X-Forwarded-For`` counts only behind configured proxies: anyone can send it,
    so without a proxy that overwrites it, it would let a client pick its own address."""
    meta = getattr(request, "META", {})
    remote = str(meta.get("REMOTE_ADDR") or "")
    proxies = trusted_proxies()
    forwarded = str(meta.get("HTTP_X_FORWARDED_FOR") or "")
    hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
    if proxies == 0 or not hops:
        return remote[:MAX_ADDRESS_LENGTH]
    # Each trusted proxy appends the address it saw; the N-th from the right is the client.
    return hops[-min(proxies, len(hops))][:MAX_ADDRESS_LENGTH]
