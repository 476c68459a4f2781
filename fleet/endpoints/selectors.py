"""Reads for the gateways: every endpoint with the copies its balancer should hold now.

A copy is in the rotation when it is ``ready`` (:func:`fleet.allocations.ports.allocation_ready`:
running, its health check passing, on a host that is not offline) and has a host port for the
endpoint's port on a host whose address is known. It is *draining* (no new request; those in
flight finish) from the moment Fleet decides it goes: its slice is releasing (an eviction, a
scale-in, a drain), its workload is stopping, or its move's new copy runs. Any other copy is not
in the balancer: starting, failed, or on a host that went offline (the balancer's own checks
take such a copy out even sooner).
"""

from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist

from fleet.allocations.models import Allocation, AllocationState, WorkloadState
from fleet.allocations.ports import allocation_ports
from fleet.endpoints.haproxy.sync import Route, Server
from fleet.endpoints.models import Endpoint
from fleet.inventory.models import HostStatus


def copy_state(allocation: Allocation) -> str | None:
    """``ready``, ``draining`` or ``None`` (not in the balancer) for one copy."""
    if allocation.gpu.host.status == HostStatus.OFFLINE:
        return None
    serving = allocation.workload_state in (WorkloadState.RUNNING, WorkloadState.STOPPING)
    if not serving:
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
    return "ready"


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
            Server(f"r{allocation.pk}", address, port, draining=state == "draining")
        )
    return [
        Route(e.slot, e.hostname, e.path_prefix, tuple(servers[pk]))
        for pk, e in sorted(endpoints.items(), key=lambda item: item[1].slot)
    ]
