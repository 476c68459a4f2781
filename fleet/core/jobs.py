"""Background work by name: the one way a service asks Celery for a task.

Tasks live on the top floor (``fleet.tasks``: thin, IDs in, a service called), so a service on a
lower floor never imports them; it names the task. On a real broker the name is all a worker
needs. In the embedded mode (``CELERY_TASK_ALWAYS_EAGER``) the task runs in this process, so it
must be registered here: Celery's autodiscovery imports ``fleet.tasks`` when asked to.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from fleet.celery import app


def enqueue(name: str, *args: Any) -> None:
    """Run the task ``name`` with ``args``: on a worker, or here at once in the embedded mode."""
    if app.conf.task_always_eager:
        if name not in app.tasks:
            app.loader.import_default_modules()  # autodiscovery: registers fleet.tasks
        app.tasks[name].delay(*args)
    else:
        app.send_task(name, args=list(args))


ADVANCE_OPERATION = "fleet.advance_operation"


def advance_after_commit(operation_id: int) -> None:
    """Once the transaction commits, move the operation forward on a worker (at once, in this
    process, in the embedded mode), not in the request that started it: a rollout's first
    drains, their moves and those moves' first steps would otherwise all run before the
    request answers. A failure is logged (``robust``); beat advances it again."""
    transaction.on_commit(lambda: enqueue(ADVANCE_OPERATION, operation_id), robust=True)
