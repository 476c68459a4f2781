"""Celery tasks: thin. They take IDs, load rows and call a service."""

from __future__ import annotations

from fleet.celery import app


@app.task(name="fleet.push_desired_state", acks_late=True, ignore_result=True)
def push_desired_state(host_id: int) -> None:
    """Push the host's current desired state to its agent and record it as dispatched."""
    from fleet.partitioning.delivery import desired_state_push

    desired_state_push(host_id=host_id)


@app.task(name="fleet.redeliver", ignore_result=True)
def redeliver() -> int:
    """Beat: re-push every unacknowledged generation whose backoff has passed."""
    from fleet.partitioning.delivery import desired_state_push, hosts_to_redeliver

    hosts = hosts_to_redeliver()
    for host_id in hosts:
        desired_state_push(host_id=host_id)
    return len(hosts)


@app.task(name="fleet.expire_operations", ignore_result=True)
def expire_operations() -> int:
    """Beat: expire operations no agent completed in time, with a reason."""
    from fleet.partitioning.delivery import operations_expire

    return len(operations_expire())


@app.task(name="fleet.mark_offline_hosts", ignore_result=True)
def mark_offline_hosts() -> int:
    """Beat: hosts that missed their heartbeats go offline; their replicas are re-placed."""
    from fleet.allocations.health import hosts_went_offline
    from fleet.partitioning.delivery import hosts_mark_offline

    offline = hosts_mark_offline()
    hosts_went_offline(offline)
    return len(offline)


@app.task(name="fleet.recover_quiet_gpus", ignore_result=True)
def recover_quiet_gpus() -> int:
    """Beat: GPUs unhealthy from a fatal Xid return after a quiet period."""
    from fleet.allocations.health import gpus_recover_quiet

    return len(gpus_recover_quiet())


@app.task(name="fleet.advance_drains", ignore_result=True)
def advance_drains() -> int:
    """Beat: move every running drain-and-reshape forward (deadlines, rollbacks)."""
    from fleet.allocations.drain import drains_advance

    return len(drains_advance())


@app.task(name="fleet.telemetry_rollup", ignore_result=True)
def telemetry_rollup() -> int:
    """Beat: per-minute means of the closed minutes into PostgreSQL; checkpoint latest samples."""
    from fleet.inventory.telemetry import rollup

    return rollup()


@app.task(name="fleet.telemetry_retention", ignore_result=True)
def telemetry_retention() -> int:
    """Beat: delete history points past their retention (60 s points: a week)."""
    from fleet.inventory.telemetry import retention

    return retention()


@app.task(name="fleet.retry_replicas", ignore_result=True)
def retry_replicas() -> int:
    """Beat: place again the replicas a fault left without healthy capacity."""
    from fleet.allocations.health import replicas_retry

    return len(replicas_retry())
