"""Where a replica serves: its host ports, as its agent reported them
(:func:`fleet.allocations.workloads.workloads_record` checked them), its host's address, and
whether it is ready to take traffic. Reads only; an endpoint's load balancer (issue 23) is
fed from these."""

from __future__ import annotations

from typing import Any

from fleet.allocations.models import Allocation, WorkloadState
from fleet.allocations.workloads import workload_of
from fleet.inventory.models import HostStatus
from hostagent import protocol


def allocation_ports(allocation: Allocation) -> dict[str, int]:
    """The replica's host port per declared port name (``{}`` when none was reported)."""
    ports: Any = allocation.ports
    if not isinstance(ports, dict):
        return {}
    return {str(k): v for k, v in ports.items() if isinstance(v, int) and 1 <= v <= 65535}


def allocation_address(allocation: Allocation) -> str | None:
    """``host:port`` of the replica's first declared port that has a host port, or ``None``
    (the host's agent gave no ``--address``, or no port was reported)."""
    host = allocation.gpu.host.address
    ports = allocation_ports(allocation)
    if not host or not ports:
        return None
    declared = protocol.declared_ports(workload_of(allocation.deployment, allocation))
    first = next((ports[p["name"]] for p in declared if p["name"] in ports), None)
    if first is None:
        return None
    return f"[{host}]:{first}" if ":" in host and not host.startswith("[") else f"{host}:{first}"


def allocation_ready(allocation: Allocation) -> bool:
    """Whether the replica serves: ``running`` (the agent's health check passed, or there is
    none) on a host that is not offline."""
    return (
        allocation.workload_state == WorkloadState.RUNNING
        and allocation.gpu.host.status != HostStatus.OFFLINE
    )
