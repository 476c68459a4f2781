"""Slowing down password guessing on the sign-in forms (``/login/``, ``/admin/login/``).

Failures are counted per user name and per client address in Django's cache (Redis in
production, so every ASGI process sees the same counts). After the free failures each further
one locks that name or address out for 1, 2, 4, … seconds, at most
``FLEET_LOGIN_MAX_LOCKOUT_SECONDS``; a locked form does not even check the password. A count is
forgotten a day after its last failure, and a user name's count when that user signs in.
An address gets more free failures than a name: many people may share one (a NAT, a VPN).

When the cache cannot be reached, sign-in goes on unthrottled (logged): an outage of Redis must
not lock every user out.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time

from django.conf import settings
from django.core.cache import cache

logger = logging.getLogger(__name__)

MEMORY_SECONDS = 86_400
ADDRESS_FREE_FACTOR = 4


def lockout_seconds(failures: int, *, free: int, max_seconds: int) -> int:
    """How long ``failures`` lock a name or an address out: 0 up to ``free``, then doubling."""
    beyond = failures - free
    if beyond <= 0:
        return 0
    return min(max_seconds, 1 << min(beyond - 1, 32))


def _now() -> float:
    return time.time()


def _free_failures() -> int:
    return settings.FLEET_LOGIN_FREE_FAILURES


def _max_lockout() -> int:
    return settings.FLEET_LOGIN_MAX_LOCKOUT_SECONDS


def _subjects(username: str, address: str) -> list[tuple[str, int]]:
    """The cache key stem and the free failures of each thing being counted."""
    subjects = []
    name = username.strip().lower()[:150]
    if name:
        subjects.append((_stem("user", name), _free_failures()))
    if address:
        subjects.append((_stem("addr", address), _free_failures() * ADDRESS_FREE_FACTOR))
    return subjects


def _stem(kind: str, value: str) -> str:
    # Hashed: user names are arbitrary text, and cache keys must stay short and plain.
    return f"fleet:login:{kind}:{hashlib.sha256(value.encode('utf-8')).hexdigest()[:32]}"


def wait_seconds(*, username: str, address: str) -> int:
    """Seconds until this name and this address may try again (0: they may now)."""
    now = _now()
    stems = [stem for stem, _ in _subjects(username, address)]
    try:
        until = cache.get_many([f"{stem}:until" for stem in stems]).values()
    except Exception:
        logger.warning("sign-in lockout unchecked: the cache is unreachable", exc_info=True)
        return 0
    left = max([float(u) - now for u in until if isinstance(u, int | float)], default=0.0)
    return math.ceil(left) if left > 0 else 0


def failure_record(*, username: str, address: str) -> int:
    """Count one failure; the lockout (seconds) it started, 0 if none."""
    now = _now()
    longest = 0
    try:
        for stem, free in _subjects(username, address):
            failures = _increment(f"{stem}:failures")
            lockout = lockout_seconds(failures, free=free, max_seconds=_max_lockout())
            if lockout:
                cache.set(f"{stem}:until", now + lockout, timeout=lockout + 1)
                longest = max(longest, lockout)
    except Exception:
        logger.warning("sign-in failure not counted: the cache is unreachable", exc_info=True)
    return longest


def _increment(key: str) -> int:
    # add + incr are atomic in Redis, so concurrent guesses cannot lose counts.
    cache.add(key, 0, timeout=MEMORY_SECONDS)
    try:
        count = int(cache.incr(key))
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=MEMORY_SECONDS)
        count = 1
    cache.touch(key, timeout=MEMORY_SECONDS)
    return count


def forget(*, username: str) -> None:
    """A user signed in: their name's failures no longer count (the address's still do)."""
    try:
        for stem, _ in _subjects(username, ""):
            cache.delete_many([f"{stem}:failures", f"{stem}:until"])
    except Exception:
        logger.warning("sign-in failures not forgotten: the cache is unreachable", exc_info=True)
