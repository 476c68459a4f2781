"""A host was heard: ``Host.last_seen_at`` written at most every :func:`seen_every` seconds per
host and process, and an ``offline`` host back to ``ready`` (any message of its agent, not
only a new hello, says it is there)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.core import alerts
from fleet.core.events import publish_changed
from fleet.core.locking import lock_available
from fleet.inventory.models import Host, HostStatus

_lock = threading.Lock()
# (host id, created) -> when this process last wrote the host's last_seen_at
_written: dict[tuple[int, float], float] = {}


def forget_written() -> None:
    with _lock:
        _written.clear()


def seen_every() -> float:
    """How stale ``Host.last_seen_at`` may get: a quarter of the offline limit, at most 5 s."""
    limit = float(settings.FLEET_HEARTBEAT_SECONDS) * int(settings.FLEET_OFFLINE_AFTER_MISSED)
    return max(0.0, min(5.0, limit / 4))


def hosts_touch(hosts: list[tuple[int, float]], now: float) -> None:
    """``last_seen_at`` for the hosts (``(id, created)``) this process has not written for
    :func:`seen_every` (heard at ``now``, a Unix time)."""
    every = seen_every()
    with _lock:
        due = [h for h in hosts if now - _written.get(h, 0.0) >= every]
        if len(_written) > 100_000:
            _written.clear()
        for h in due:
            _written[h] = now
    if due:
        skipped: list[int] = []
        hosts_seen([h[0] for h in due], skipped=skipped)
        if skipped:  # held by a transaction now: written with the host's next tick
            with _lock:
                for h in due:
                    if h[0] in skipped:
                        _written.pop(h, None)


def _alert_back(host_ids: list[int]) -> None:
    hooks = alerts.alert_subscribers(alerts.HOST_BACK)
    if hooks:
        names = Host.objects.filter(pk__in=host_ids).values_list("pk", "name")
        alerts.alert_emit_each(
            event=alerts.HOST_BACK,
            items=[(f"Host {n} is back", {"host": {"id": pk, "name": n}}) for pk, n in names],
            hooks=hooks,
        )


def hosts_seen(host_ids: Sequence[int], *, skipped: list[int] | None = None) -> list[int]:
    """The hosts' agents were heard: ``last_seen_at`` is now, and those that were ``offline``
    are ``ready`` again (whatever the message was: a socket that stayed open through a
    database or Redis stall sends ticks, not a new hello). Returns the hosts that came back.

    A host row another transaction holds (a drain, a placement bumping its generation) is
    skipped, never waited for: a heartbeat must not stall behind, or deadlock with, the control
    plane. Its ids go into ``skipped`` when given."""
    with transaction.atomic():
        free = lock_available(Host, host_ids)
        if skipped is not None:
            skipped.extend(sorted(set(host_ids) - set(free)))
        if not free:
            return []
        Host.objects.filter(pk__in=free).update(last_seen_at=timezone.now())
        ids = list(
            Host.objects.filter(pk__in=free, status=HostStatus.OFFLINE).values_list("pk", flat=True)
        )
        if ids:
            # Compare-and-set: a host marked cordoned or draining meanwhile keeps that state.
            Host.objects.filter(pk__in=ids, status=HostStatus.OFFLINE).update(
                status=HostStatus.READY, offline_since=None
            )
            _alert_back(ids)
    if ids:
        publish_changed("host", ids)
    return ids
