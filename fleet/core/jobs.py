"""Background work by name: the one way a service asks Celery for a task.

Tasks live on the top floor (``fleet.tasks``: thin, IDs in, a service called), so a service on a
lower floor never imports them; it names the task. On a real broker the name is all a worker
needs. In the embedded mode (``CELERY_TASK_ALWAYS_EAGER``) the task runs in this process, so it
must be registered here: Celery's autodiscovery imports ``fleet.tasks`` when asked to.
"""

from __future__ import annotations

from typing import Any

from django.core.cache import cache
from django.db import transaction

from fleet.celery import app


def enqueue(name: str, *args: Any, countdown: float | None = None) -> None:
    """Run the task ``name`` with ``args``: on a worker (``countdown`` seconds from now, where
    given), or here at once in the embedded mode."""
    if app.conf.task_always_eager:
        if name not in app.tasks:
            app.loader.import_default_modules()  # autodiscovery: registers fleet.tasks
        app.tasks[name].delay(*args)
    elif countdown is None:
        app.send_task(name, args=list(args))
    else:
        app.send_task(name, args=list(args), countdown=countdown)


ADVANCE_OPERATION = "fleet.advance_operation"


def advance_after_commit(operation_id: int) -> None:
    """Once the transaction commits, move the operation forward on a worker (at once, in this
    process, in the embedded mode), not in the request that started it: a rollout's first
    drains, their moves and those moves' first steps would otherwise all run before the
    request answers. A failure is logged (``robust``); beat advances it again."""
    transaction.on_commit(lambda: enqueue(ADVANCE_OPERATION, operation_id), robust=True)


PLACE_QUEUE = "fleet.place_queue"
PLACE_QUEUE_KICK_KEY = "fleet:place-queue-kick"


def place_queue_after_commit() -> None:
    """Capacity was freed: once the transaction commits, place waiting replicas from the queue
    on a worker (:mod:`fleet.sharing.placing`), at once at most once a second fleet-wide (beat
    runs it every ``FLEET_QUEUE_PLACE_EVERY_S`` anyway). Not in the embedded mode: there the
    embedded scheduler runs it, not the request or agent message that freed the capacity."""
    _kick_after_commit(PLACE_QUEUE, PLACE_QUEUE_KICK_KEY)


RECLAIM = "fleet.reclaim"
RECLAIM_KICK_KEY = "fleet:reclaim-kick"


def reclaim_after_commit() -> None:
    """A replica was left waiting for capacity: once the transaction commits, start the
    reclaims its team's deserved share may call for on a worker
    (:mod:`fleet.sharing.reclaiming`), at most once a second fleet-wide, rather than at beat's
    next sweep (``FLEET_RECLAIM_EVERY_S``): a returning team's replica does not wait a period
    before its reclaim starts. Not in the embedded mode (its scheduler runs the sweeps)."""
    _kick_after_commit(RECLAIM, RECLAIM_KICK_KEY)


KICK_HOLD_S = 1
"""A kick runs its task at once at most this often; one that comes while held is deferred."""


def _kick_after_commit(name: str, key: str) -> None:
    """Run ``name`` once the transaction commits: at once unless it ran less than
    :data:`KICK_HOLD_S` ago, else once more when the hold is over (one deferred run covers
    every kick of the hold): a kick is never lost to the one before it, which would leave what
    it asked for to beat's next period (what-would-it-take's replica that fits, a departure's
    capacity taken meanwhile by an arrival)."""
    if app.conf.task_always_eager:
        return

    def kick() -> None:
        if cache.add(key, 1, KICK_HOLD_S):
            enqueue(name)
        elif cache.add(f"{key}:deferred", 1, KICK_HOLD_S):
            enqueue(name, countdown=KICK_HOLD_S)

    transaction.on_commit(kick, robust=True)
