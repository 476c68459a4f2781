"""Prometheus service discovery: every ready replica's ``metrics`` port, as Prometheus'
``http_sd_configs`` reads it, so users scrape their model servers' own metrics (vLLM, TGI,
Triton) without writing target lists.

A deployment is scraped when its workload declares a port named ``metrics``; each replica is
one target group, ``host:port`` of its host port for it, labelled with what it is and where it
runs. Only ready replicas (running, health check passing, on a host that is not offline) are
listed, so a replica that moves leaves one target and gains another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fleet.allocations.models import Allocation, AllocationState
from fleet.allocations.ports import allocation_ports, allocation_ready

METRICS_PORT = "metrics"


def scrape_targets(sees: Callable[[int | None], bool]) -> list[dict[str, Any]]:
    """Target groups, one per ready replica with a ``metrics`` port, of the deployments whose
    team ``sees`` (the reader's :func:`fleet.core.teams.can_see_spec`), in one query."""
    rows = (
        Allocation.objects.filter(gpu_slot=0, ports__has_key=METRICS_PORT)
        .exclude(state=AllocationState.RELEASING)
        .select_related("gpu__host", "partition", "deployment__team")
        .order_by("deployment__name", "replica", "pk")
    )
    groups = []
    for allocation in rows:
        deployment = allocation.deployment
        host = allocation.gpu.host
        port = allocation_ports(allocation).get(METRICS_PORT)
        if port is None or not host.address or not allocation_ready(allocation):
            continue
        if not sees(deployment.team_id):
            continue
        address = f"[{host.address}]" if ":" in host.address else host.address
        groups.append(
            {
                "targets": [f"{address}:{port}"],
                "labels": {
                    "deployment": deployment.name,
                    "team": deployment.team.slug if deployment.team else "",
                    "replica": str(allocation.replica),
                    "gpu_uuid": allocation.gpu.uuid,
                    "profile": allocation.partition.profile_name or allocation.kind,
                    "host": host.name,
                },
            }
        )
    return groups
