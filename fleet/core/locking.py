"""Row locks for background writes that may wait for their next round (heartbeats, telemetry
checkpoints): they take only the rows no other transaction holds, in primary-key order, so they
never wait behind a control-plane transaction (a drain, a placement) nor deadlock with one that
locks the same rows in another order."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connection
from django.db.models import Model


def lock_available(model: type[Model], ids: Iterable[int]) -> list[int]:
    """Lock the rows of ``model`` among ``ids`` that no other transaction holds (``FOR UPDATE
    SKIP LOCKED``, in primary-key order) and return their ids. Call it inside a transaction.
    Backends without row locks (SQLite serialises writers) lock nothing and return them all."""
    wanted = sorted(set(ids))
    if not wanted:
        return []
    manager: Any = model._default_manager
    if not connection.features.has_select_for_update_skip_locked:
        return wanted
    return list(
        manager.select_for_update(skip_locked=True)
        .filter(pk__in=wanted)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
