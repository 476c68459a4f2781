"""The OIDC provider's endpoints: from ``<issuer>/.well-known/openid-configuration``, read on
first use and kept for an hour, unless each is set (``FLEET_OIDC_*_ENDPOINT``, ``_JWKS_URI``).

Read lazily, not at start: Fleet must start (and local and LDAP sign-in must work) while the
identity provider is down."""

from __future__ import annotations

import threading
import time
from typing import Any

import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

CACHE_SECONDS = 3600.0
JWKS_REFRESH_MIN_SECONDS = 10.0
_lock = threading.Lock()
_cache: dict[str, tuple[float, dict[str, Any]]] = {}


def discovery_document(issuer: str) -> dict[str, Any]:
    """The issuer's discovery document (cached per process); ``ImproperlyConfigured`` when
    it cannot be read or names another issuer."""
    with _lock:
        cached = _cache.get(issuer)
        if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1]
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT, verify=settings.OIDC_VERIFY_SSL)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as error:
        raise ImproperlyConfigured(f"OIDC discovery failed at {url}: {error}") from None
    if not isinstance(document, dict) or document.get("issuer", "").rstrip("/") != issuer:
        raise ImproperlyConfigured(f"OIDC discovery at {url} names another issuer")
    with _lock:
        _cache[issuer] = (time.monotonic(), document)
    return document


def endpoint(name: str) -> str:
    """``authorization_endpoint``, ``token_endpoint``, ``userinfo_endpoint``,
    ``end_session_endpoint`` or ``jwks_uri``: as set, else as discovered."""
    explicit = settings.FLEET_OIDC_ENDPOINTS.get(name, "")
    if explicit:
        return str(explicit)
    value = discovery_document(settings.FLEET_OIDC_ISSUER).get(name)
    if not isinstance(value, str) or not value:
        raise ImproperlyConfigured(f"The OIDC provider does not publish {name}")
    return value


def jwks(*, refresh: bool = False) -> dict[str, Any]:
    """The provider's signing keys, kept an hour; ``refresh`` (a key id not found: the provider
    rotated its keys) reads them again, at most every 10 s, so that posting tokens with made-up
    key ids cannot make Fleet call the provider for each."""
    url = endpoint("jwks_uri")
    with _lock:
        cached = _cache.get(url)
    if cached is not None:
        age = time.monotonic() - cached[0]
        if age < CACHE_SECONDS and (not refresh or age < JWKS_REFRESH_MIN_SECONDS):
            return cached[1]
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT, verify=settings.OIDC_VERIFY_SSL)
        response.raise_for_status()
        keys = response.json()
    except (requests.RequestException, ValueError) as error:
        raise ImproperlyConfigured(f"OIDC keys unreadable at {url}: {error}") from None
    if not isinstance(keys, dict) or not isinstance(keys.get("keys"), list):
        raise ImproperlyConfigured(f"OIDC keys at {url} are not a JWK set")
    with _lock:
        _cache[url] = (time.monotonic(), keys)
    return keys


def forget() -> None:
    with _lock:
        _cache.clear()
