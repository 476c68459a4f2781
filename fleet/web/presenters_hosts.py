"""Rows to view models for the host pages: a row of the hosts list, and one host's GPUs, labels
and maintenance (its drain, scheduled or running)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from fleet.agents.versions import agent_problem
from fleet.core.models import Operation
from fleet.inventory.models import Gpu, Host, HostStatus

# The badge colour of each host status.
STATUS_TONES = {
    HostStatus.READY: "good",
    HostStatus.CORDONED: "warn",
    HostStatus.DRAINING: "info",
    HostStatus.MAINTENANCE: "warn",
    HostStatus.UNHEALTHY: "bad",
    HostStatus.OFFLINE: "bad",
}
# Labels of the host drain's steps (``fleet.allocations.maintenance.HostDrainStep``).
DRAIN_STEPS = {
    "scheduled": "scheduled",
    "move": "moving replicas",
    "wait_empty": "waiting for the old copies to stop",
    "done": "done",
    "failed": "failed",
}


def _signature(*values: Any) -> str:
    return hashlib.blake2s(repr(values).encode(), digest_size=6).hexdigest()


@dataclass(frozen=True)
class DrainInfo:
    """A host's open drain: when it starts (or started), where it is, and what it waits for."""

    operation_id: int
    scheduled: bool
    at: datetime | None
    step: str
    waiting_for: str
    stuck: tuple[str, ...]


def drain_info(operation: Operation | None) -> DrainInfo | None:
    if operation is None:
        return None
    payload = operation.payload or {}
    step = str(payload.get("step", ""))
    return DrainInfo(
        operation_id=operation.pk,
        scheduled=step == "scheduled",
        at=parse_datetime(str(payload.get("at", ""))),
        step=DRAIN_STEPS.get(step, step),
        waiting_for=str(payload.get("waiting_for", "")),
        stuck=tuple(str(v) for v in (payload.get("stuck") or {}).values()),
    )


@dataclass(frozen=True)
class HostRow:
    """One row of the hosts list (and the head of a host's page)."""

    id: int
    name: str
    status: str
    status_label: str
    tone: str
    agent_version: str
    # What to upgrade when this server does not serve the host's agent (fleet.agents.versions).
    agent_problem: str
    runtime: str
    driver_version: str
    gpu_count: int
    products: str
    labels: tuple[tuple[str, str], ...]
    last_seen_at: datetime | None
    drain: DrainInfo | None

    @property
    def signature(self) -> str:
        seen = self.last_seen_at.replace(second=0, microsecond=0) if self.last_seen_at else None
        return _signature(
            self.name,
            self.status,
            self.agent_version,
            self.agent_problem,
            self.runtime,
            self.driver_version,
            self.gpu_count,
            self.products,
            self.labels,
            seen,
            self.drain,
        )


def _products(gpus: list[Gpu]) -> str:
    counts: dict[str, int] = {}
    for gpu in gpus:
        counts[gpu.product_name] = counts.get(gpu.product_name, 0) + 1
    return ", ".join(f"{n}x {name}" if n > 1 else name for name, n in counts.items())


def host_row(host: Host, drain: Operation | None = None) -> HostRow:
    """``host`` with its GPUs prefetched (:func:`fleet.web.selectors.hosts_with_gpus`)."""
    gpus = list(host.gpus.all())
    return HostRow(
        id=host.pk,
        name=host.name,
        status=host.status,
        status_label=host.get_status_display(),
        tone=STATUS_TONES.get(HostStatus(host.status), "info"),
        agent_version=host.agent_version,
        agent_problem=agent_problem(host),
        runtime=host.get_runtime_display() if host.agent_version else "",
        driver_version=host.driver_version,
        gpu_count=len(gpus),
        products=_products(gpus),
        labels=tuple(sorted((str(k), str(v)) for k, v in (host.labels or {}).items())),
        last_seen_at=host.last_seen_at,
        drain=drain_info(drain),
    )


def labels_text(labels: tuple[tuple[str, str], ...]) -> str:
    """The labels as the edit box shows them: one ``key=value`` a line."""
    return "\n".join(f"{key}={value}" for key, value in labels)
