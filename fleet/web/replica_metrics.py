"""The deployment page's replica metrics panel: one replica's utilisation and memory over 1h,
24h or 7d, drawn on the server as plain SVG (:mod:`fleet.web.charts`, the GPU page's charts);
``static/web/replica_metrics.js`` re-fetches the panel's body when the replica or the window
changes, and now and then to follow the hour."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from fleet.allocations.accounting.telemetry import WINDOWS, replica_series
from fleet.allocations.models import Allocation, AllocationState, Deployment
from fleet.core.roles import Role
from fleet.core.teams import can_see_spec
from fleet.web import charts, selectors
from fleet.web.access import no_access, role_required
from fleet.web.presenters_deployments import slice_label

WINDOW_CHOICES = (("1h", "1 hour"), ("24h", "24 hours"), ("7d", "7 days"))
WINDOW_WORDS = {"1h": "last hour", "24h": "last 24 hours", "7d": "last 7 days"}
MINUS = "\u2212"
AXIS = {
    "1h": (f"{MINUS}60 min", f"{MINUS}30 min"),
    "24h": (f"{MINUS}24 h", f"{MINUS}12 h"),
    "7d": (f"{MINUS}7 d", f"{MINUS}3.5 d"),
}
# Why a series has no value, by its source (the hardware, not a fault).
NO_UTILISATION = {
    "mig_instance": "Not available: NVML reports no utilisation for this MIG instance (GPM "
    "needs Hopper or later)",
    "processes": "Not available: NVML reports no utilisation per MPS client",
    "gpu": "Not available: no utilisation reported",
}
NO_MEMORY = {
    "mig_instance": "Not available: no memory reported for this MIG instance",
    "processes": "Not available: no process of this replica reported its memory",
    "gpu": "Not available: no process of this replica reported its memory",
}


@dataclass(frozen=True)
class ReplicaOption:
    allocation_id: int
    label: str
    selected: bool


def _allocations(deployment: Deployment) -> list[Allocation]:
    return sorted(
        deployment.allocations.all(),
        key=lambda a: (a.state == AllocationState.RELEASING, a.replica, a.gpu_slot, a.pk),
    )


def _label(allocation: Allocation) -> str:
    gpu = allocation.gpu
    where = f"{gpu.host.name}/gpu{gpu.index} {slice_label(allocation)}"
    slot = f" GPU {allocation.gpu_slot + 1}" if allocation.gpu_slot else ""
    gone = " (stopping)" if allocation.state == AllocationState.RELEASING else ""
    return f"Replica {allocation.replica}{slot} on {where}{gone}"


def _int(raw: Any) -> int | None:
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def metrics_context(
    deployment: Deployment, query: Mapping[str, Any], *, now: float | None = None
) -> dict[str, Any]:
    """``rm``: the replicas to pick from, the window, and the chosen replica's two charts
    (the first replica and the hour unless ``query`` names others; an unknown value is
    ignored)."""
    now = time.time() if now is None else now
    allocations = _allocations(deployment)
    wanted = _int(query.get("allocation"))
    chosen = next(
        (a for a in allocations if a.pk == wanted), allocations[0] if allocations else None
    )
    window = str(query.get("window", "1h"))
    window = window if window in WINDOWS else "1h"
    options = [ReplicaOption(a.pk, _label(a), a is chosen) for a in allocations]
    context: dict[str, Any] = {
        "options": options,
        "window": window,
        "windows": WINDOW_CHOICES,
        "window_words": WINDOW_WORDS[window],
        "axis_start": AXIS[window][0],
        "axis_mid": AXIS[window][1],
        "chosen": chosen,
        "charts": [],
    }
    if chosen is not None:
        context.update(_charts(chosen, window, now))
    return {"rm": context}


def _charts(allocation: Allocation, window: str, now: float) -> dict[str, Any]:
    series = replica_series(allocation, window=window, now=now)
    half = series["bucket_s"] / 2
    points: list[dict[str, float | None]] = [
        {
            "t": p["ts"] + half,
            "utilization_percent": p["utilization_percent"],
            "memory_used_mib": p["memory_used_mib"],
        }
        for p in series["points"]
    ]
    t0 = now - WINDOWS[window]
    source = series["source"]
    no_samples = "No sample of this replica in this window"
    specs = (
        (charts.ChartSpec("utilization_percent", "Utilisation", "%", 100), NO_UTILISATION),
        (
            charts.ChartSpec("memory_used_mib", "Memory used", "MiB", allocation.memory_mib),
            NO_MEMORY,
        ),
    )
    drawn = [
        (charts.line_chart(points, spec, t0=t0, t1=now), reasons[source] if points else no_samples)
        for spec, reasons in specs
    ]
    return {"charts": drawn, "source": source, "bucket_s": series["bucket_s"]}


@never_cache
@require_GET
@role_required(Role.MEMBER)
def deployment_metrics(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """The panel's body for ``?allocation=&window=`` (the deployment's team's members and
    fleet viewers and up)."""
    deployment = selectors.deployment_detail(deployment_id)
    if deployment is None:
        raise Http404("No such deployment.")
    if not can_see_spec(request.user, deployment.team_id):
        return no_access(request, Role.VIEWER)
    context = {"deployment": deployment, **metrics_context(deployment, request.GET)}
    return render(request, "web/fragments/deployment_metrics_body.html", context)
