"""Agent messages the control plane refused: counted per host and reason, logged sparingly.

A refused message changes nothing for anyone. What is left of it is a count, exposed by
``/metrics`` as ``fleet_agent_messages_refused_total{host, reason}``, and at most one log line
per host a minute, with the value cut short and quoted (``%r``): a hostile agent can neither
flood the log nor forge lines in it.

Counts gather in process memory and reach the shared telemetry store (Redis in production, so
every process's refusals add up) when :func:`flush` runs: after every telemetry batch, after a
REST report, and from the agent socket at most once a second.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from fleet.core.ratelimit import OncePer, cut
from fleet.inventory.telemetry import get_store

logger = logging.getLogger(__name__)

REASONS = (
    "not_json",  # not JSON, or nested too deeply to read
    "invalid",  # not the protocol: a missing key, a value out of range, a duplicate GPU
    "stale_ts",  # a timestamp more than a day from the server's clock
    "too_large",  # a message over the size limit
    "rate_limited",  # more messages than the socket's budget
)
_KEY_PREFIX = "refused:"

_lock = threading.Lock()
_pending: Counter[str] = Counter()
_log_once = OncePer(60.0)


def refused(host_id: int, reason: str, detail: object) -> None:
    """Count one refused message of ``host_id`` and log it (once a minute per host)."""
    with _lock:
        _pending[f"{_KEY_PREFIX}{host_id}:{reason}"] += 1
    if _log_once(host_id):
        logger.warning(
            "host %s: a message was refused (%s): %s (more are counted in /metrics, not logged"
            " for a minute)",
            host_id,
            reason,
            cut(detail),
        )


def pending() -> bool:
    with _lock:
        return bool(_pending)


def flush() -> None:
    """Add the counts gathered here to the shared store (call from a worker thread)."""
    with _lock:
        counts = dict(_pending)
        _pending.clear()
    if not counts:
        return
    try:
        get_store().add_counts(counts)
    except Exception:  # the store is down: keep the counts for the next flush
        with _lock:
            _pending.update(counts)
        logger.info("refusal counts not stored yet", exc_info=True)


def totals() -> dict[tuple[int, str], int]:
    """Refused messages per ``(host id, reason)``, across every process."""
    out: dict[tuple[int, str], int] = {}
    for key, n in get_store().counts().items():
        if not key.startswith(_KEY_PREFIX):
            continue
        host, _, reason = key.removeprefix(_KEY_PREFIX).partition(":")
        if host.isdecimal():
            out[(int(host), reason)] = n
    return out


def clear() -> None:
    with _lock:
        _pending.clear()
