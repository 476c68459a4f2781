"""A deployment's change that rides on each of its replicas' desired allocations (an endpoint's
``drain_s``, a replica metric's ``scrape``) reaches the agents: the hosts running its replicas
get a new desired generation, pushed once the transaction commits."""

from __future__ import annotations

from django.db import transaction

from fleet.allocations.models import Allocation
from fleet.partitioning.desired import host_bump_generation, schedule_push


def resend_on_commit(deployment_id: int) -> None:
    """After the current transaction commits, send the desired state again to every host that
    runs one of the deployment's placed replicas (each host in a transaction of its own)."""
    placed = Allocation.objects.placed().filter(deployment_id=deployment_id)
    hosts = sorted(set(placed.values_list("gpu__host_id", flat=True)))

    def resend() -> None:
        for host_id in hosts:
            with transaction.atomic():
                host_bump_generation(host_id)
                schedule_push(host_id)

    transaction.on_commit(resend, robust=True)
