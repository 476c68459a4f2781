"""Celery tasks: thin. They take IDs, load rows and call a service.

Services ask for them by name (:func:`fleet.core.jobs.enqueue`), never by importing this module.
Each task imports its service inside the function: the worker imports this module to register
the tasks before Django's apps are ready, and models cannot be imported before then.
"""

from __future__ import annotations

from fleet.celery import app


@app.task(name="fleet.push_desired_state", acks_late=True, ignore_result=True)
def push_desired_state(host_id: int) -> None:
    """Push the host's current desired state to its agent and record it as dispatched."""
    from fleet.agents.delivery import desired_state_push

    desired_state_push(host_id=host_id)


@app.task(name="fleet.advance_operation", ignore_result=True)
def advance_operation(operation_id: int) -> str | None:
    """Move one long-running operation (any kind in the workflow registry) forward, after the
    transaction that started or changed it committed, or after one of its children ended."""
    from fleet.workflows.registry import workflow_advance

    return workflow_advance(operation_id=operation_id)


@app.task(name="fleet.redeliver", ignore_result=True)
def redeliver() -> int:
    """Beat: re-push every unacknowledged generation whose backoff has passed."""
    from fleet.agents.delivery import desired_state_push
    from fleet.partitioning.delivery import hosts_to_redeliver

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
    """Beat: hosts that missed their heartbeats go offline; the replicas of hosts offline past
    the grace period are re-placed, at a limited rate and never while most hosts are offline."""
    from fleet.partitioning.delivery import hosts_mark_offline
    from fleet.workflows.offline import hosts_evict_offline

    offline = hosts_mark_offline()
    hosts_evict_offline()
    return len(offline)


@app.task(name="fleet.recover_quiet_gpus", ignore_result=True)
def recover_quiet_gpus() -> int:
    """Beat: GPUs unhealthy from a fatal Xid return after a quiet period."""
    from fleet.workflows.health import gpus_recover_quiet

    return len(gpus_recover_quiet())


@app.task(name="fleet.advance_workflows", ignore_result=True)
def advance_workflows() -> int:
    """Beat: move every running long-running operation forward (its deadline, its next step, a
    wake-up that was lost): every kind in the workflow registry."""
    from fleet.workflows.registry import workflows_advance

    return len(workflows_advance())


@app.task(name="fleet.reclaim", ignore_result=True)
def reclaim() -> int:
    """Beat: start a reclaim for the first waiting replica that its team's deserved share
    entitles and that only moving or stopping borrowed replicas would place (one at a time)."""
    from fleet.sharing.reclaiming import reclaims_start

    return len(reclaims_start())


@app.task(name="fleet.autoscale", ignore_result=True)
def autoscale() -> int:
    """Beat: evaluate every deployment's autoscaling policy once (target tracking)."""
    from fleet.autoscaling.services import autoscale_all

    return autoscale_all()


@app.task(name="fleet.telemetry_rollup", ignore_result=True)
def telemetry_rollup() -> int:
    """Beat: per-minute means of the closed minutes into PostgreSQL (GPUs, then replicas);
    checkpoint latest samples."""
    from fleet.allocations.accounting.telemetry import replica_rollup
    from fleet.inventory.telemetry import rollup

    return rollup() + replica_rollup()


@app.task(name="fleet.telemetry_retention", ignore_result=True)
def telemetry_retention() -> int:
    """Beat: delete history points past their retention (60 s points of GPUs and replicas: a
    week)."""
    from fleet.allocations.accounting.telemetry import replica_retention
    from fleet.inventory.telemetry import retention

    return retention() + replica_retention()


@app.task(name="fleet.retry_replicas", ignore_result=True)
def retry_replicas() -> int:
    """Beat: place again the replicas a fault left without healthy capacity."""
    from fleet.workflows.health import replicas_retry

    return len(replicas_retry())


@app.task(name="fleet.place_queue", ignore_result=True)
def place_queue() -> int:
    """Beat: place the waiting replicas of auto-placed deployments that fit now, in queue order
    (:mod:`fleet.sharing.placing`)."""
    from fleet.sharing.placing import queue_place

    return len(queue_place())


@app.task(name="fleet.wit_refresh", ignore_result=True)
def wit_refresh() -> int:
    """Beat: compute and cache what would it take for every waiting replica, when the fleet
    changed since the last run (:mod:`fleet.sharing.wit`)."""
    from fleet.sharing.wit import wit_refresh as refresh

    return refresh().computed


@app.task(name="fleet.prune_login_failures", ignore_result=True)
def prune_login_failures() -> int:
    """Beat: forget failed sign-ins older than FLEET_LOGIN_FAILURES_KEEP_DAYS (30 days)."""
    from fleet.core.services import login_failures_prune

    return login_failures_prune()


@app.task(name="fleet.prune_health_events", ignore_result=True)
def prune_health_events() -> int:
    """Beat: delete health events older than FLEET_HEALTH_EVENTS_KEEP_DAYS (30 by default)."""
    from fleet.inventory.services import health_events_prune

    return health_events_prune()


@app.task(name="fleet.deliver_alert", acks_late=True, ignore_result=True)
def deliver_alert(delivery_id: int) -> None:
    """One attempt at sending an alert to its webhook (a failure is retried by beat)."""
    from fleet.core.webhooks import alert_deliver

    alert_deliver(delivery_id=delivery_id)


@app.task(name="fleet.retry_alerts", ignore_result=True)
def retry_alerts() -> int:
    """Beat: send the alert deliveries whose backoff has passed."""
    from fleet.core.jobs import enqueue
    from fleet.core.webhooks import alert_deliveries_due

    due = alert_deliveries_due()
    for delivery_id in due:
        enqueue("fleet.deliver_alert", delivery_id)
    return len(due)


@app.task(name="fleet.prune_alert_deliveries", ignore_result=True)
def prune_alert_deliveries() -> int:
    """Beat: forget finished alert deliveries older than FLEET_ALERT_DELIVERIES_KEEP_DAYS."""
    from fleet.core.webhooks import alert_deliveries_prune

    return alert_deliveries_prune()


@app.task(name="fleet.sso_ldap_sync", ignore_result=True)
def sso_ldap_sync() -> dict[str, int]:
    """Beat: LDAP users gone from the directory lose their tokens; the others' roles follow
    their groups (a no-op unless LDAP sign-in is configured)."""
    from django.conf import settings

    if not settings.FLEET_LDAP_ENABLED:
        return {"synced": 0, "disabled": 0, "errors": 0}  # python-ldap may not be installed
    from fleet.core.sso.ldap import ldap_users_sync

    return ldap_users_sync()
