"""An endpoint as the deployment page shows it: its URL, which replicas the balancer holds, and
its live traffic as the gateways measure it."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.allocations.models import Deployment
from fleet.allocations.ports import allocation_ports
from fleet.endpoints.models import Endpoint
from fleet.endpoints.selectors import copy_state
from fleet.endpoints.services import endpoint_url
from fleet.endpoints.traffic import DeploymentTraffic, deployment_traffic


@dataclass(frozen=True)
class EndpointPanel:
    url: str | None
    port: str
    path_prefix: str | None
    hostname: str | None
    in_rotation: tuple[str, ...]  # replica labels, e.g. "qwen[0]"
    draining: tuple[str, ...]
    traffic: DeploymentTraffic | None = None  # None: no gateway measured it lately
    replica_rates: tuple[tuple[str, float | None, str], ...] = ()  # label, req/s, balancer state


def endpoint_panel(deployment: Deployment) -> EndpointPanel | None:
    """``None`` when the deployment has no endpoint. Reads the allocations already prefetched
    on the deployment (the page's own query); a copy being moved costs a query for its
    successor."""
    try:
        endpoint = deployment.endpoint  # select_related by the page's query, else one query
    except Endpoint.DoesNotExist:
        return None
    ready, draining = [], []
    traffic = deployment_traffic(deployment.pk)
    rates = []
    for allocation in deployment.allocations.all():
        if allocation.gpu_slot or endpoint.port not in allocation_ports(allocation):
            continue
        state = copy_state(allocation)
        label = f"{deployment.name}[{allocation.replica}]"
        measured = traffic.replicas.get(allocation.pk) if traffic else None
        if measured is not None:
            rates.append((label, measured.requests_per_s, measured.state))
        if state == "ready":
            ready.append(label)
        elif state == "draining":
            draining.append(label)
    return EndpointPanel(
        url=endpoint_url(endpoint),
        port=endpoint.port,
        path_prefix=endpoint.path_prefix,
        hostname=endpoint.hostname,
        in_rotation=tuple(sorted(ready)),
        draining=tuple(sorted(draining)),
        traffic=traffic,
        replica_rates=tuple(sorted(rates)),
    )
