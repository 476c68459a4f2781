"""Reads for the gateways: every endpoint with the copies its balancer should hold now.

A copy is in the rotation when it is ``ready`` (:func:`fleet.allocations.ports.allocation_ready`:
running, its health check passing, on a host that is not offline) and has a host port for the
endpoint's port on a host whose address is known. It is *draining* (no new request; those in
flight finish) from the moment Fleet decides it goes: its slice is releasing (an eviction, a
scale-in, a drain), its workload is stopping, or its move's new copy runs. Any other copy is not
in the balancer: starting, failed, or on a host that went offline (the balancer's own checks
take such a copy out even sooner).

One exception: a copy ``starting`` whose process started more than :data:`HOLD_AFTER_S` ago was
not just (re)started: its agent restarted, adopted it and is running its first health check
again (a few hundred milliseconds). The gateway *holds* such a copy as it is: one in the
rotation stays there (its replicas kept serving while the agent was away; HAProxy's own checks
still take it out if it stopped), one that was not stays out. Without it, every copy of a host
whose agent restarts left the rotation at once, and a deployment on that host answered 503.
"""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ObjectDoesNotExist
from django.utils import timezone

from fleet.allocations.models import Allocation, AllocationState, WorkloadState
from fleet.allocations.ports import allocation_ports
from fleet.endpoints.haproxy.sync import Route, Server
from fleet.endpoints.models import Endpoint
from fleet.inventory.models import HostStatus

HOLD_AFTER_S = 5.0


def copy_state(allocation: Allocation) -> str | None:
    """``ready``, ``draining``, ``hold`` (as the balancer has it) or ``None`` (not in the
    balancer) for one copy."""
    if allocation.gpu.host.status == HostStatus.OFFLINE:
        return None
    adopted = allocation.workload_state == WorkloadState.STARTING and _adopted(allocation)
    serving = allocation.workload_state in (WorkloadState.RUNNING, WorkloadState.STOPPING)
    if not (serving or adopted):
        return None
    if allocation.state == AllocationState.RELEASING:
        return "draining"
    if allocation.workload_state == WorkloadState.STOPPING:
        return "draining"
    try:
        successor = allocation.successor
    except ObjectDoesNotExist:
        successor = None
    if successor is not None and successor.workload_state == WorkloadState.RUNNING:
        return "draining"  # make before break: the new copy takes the requests
    if adopted:
        return "hold"
    return "ready"


def _adopted(allocation: Allocation) -> bool:
    """Its process has run for a while: re-checked by a restarted agent, not starting."""
    started = allocation.started_at
    return started is not None and started < timezone.now() - timedelta(seconds=HOLD_AFTER_S)


def gateway_routes() -> list[Route]:
    """Every endpoint as the gateway's sync takes it (:class:`Route`), in two queries."""
    endpoints = {e.deployment_id: e for e in Endpoint.objects.all()}
    servers: dict[int, list[Server]] = {pk: [] for pk in endpoints}
    copies = (
        Allocation.objects.filter(deployment_id__in=list(endpoints), gpu_slot=0)
        .select_related("gpu__host", "successor")
        .order_by("pk")
    )
    for allocation in copies:
        endpoint = endpoints[allocation.deployment_id]
        state = copy_state(allocation)
        port = allocation_ports(allocation).get(endpoint.port)
        address = allocation.gpu.host.address
        if state is None or port is None or not address:
            continue
        servers[allocation.deployment_id].append(
            Server(
                f"r{allocation.pk}",
                address,
                port,
                draining=state == "draining",
                hold=state == "hold",
            )
        )
    return [
        Route(e.slot, e.hostname, e.path_prefix, tuple(servers[pk]))
        for pk, e in sorted(endpoints.items(), key=lambda item: item[1].slot)
    ]
