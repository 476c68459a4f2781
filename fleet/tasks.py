"""Celery tasks: thin. They take IDs, load rows and call a service."""

from __future__ import annotations

from fleet.celery import app


@app.task(name="fleet.push_desired_state", acks_late=True, ignore_result=True)
def push_desired_state(host_id: int) -> None:
    """Push the host's current desired state to its agent and record it as dispatched."""
    from fleet.partitioning.delivery import desired_state_push

    desired_state_push(host_id=host_id)
