"""Rows to view models for the deployment pages: a row of the deployments list, a deployment's
spec, and one row per replica with its slice and workload.

Only what the database holds is shown: a value the agent has not reported is ``None`` and the
templates print "—" for it, never a made-up number.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleet.allocations.models import (
    FAILED_STATES,
    Allocation,
    AllocationState,
    Deployment,
    RequestKind,
    describe_request,
)
from fleet.allocations.models import WorkloadState as Ws
from fleet.allocations.states import DeploymentStatus, deployment_status
from fleet.autoscaling.presenters import autoscaling_panel
from fleet.web.presenters import TrayFit, format_mib

# Where a workload runs (or stops) and its start time means an uptime.
_UP_STATES = frozenset({Ws.STARTING, Ws.RUNNING, Ws.STOPPING})


def _signature(*values: Any) -> str:
    return hashlib.blake2s(repr(values).encode(), digest_size=6).hexdigest()


def _command_line(args: Any) -> str:
    """Arguments joined by spaces; one holding a space or a quote is shown as a JSON string
    (readable, and never ambiguous)."""
    words = [str(a) for a in args] if isinstance(args, list) else []
    return " ".join(
        w if w and not _NEEDS_QUOTES.search(w) else json.dumps(w, ensure_ascii=False) for w in words
    )


_NEEDS_QUOTES = re.compile(r"[\s\"\\]")


def workload_summary(workload: Any) -> str:
    """The image of a container (with its command, if any), the command line of a process, or
    ``none``."""
    if not isinstance(workload, dict) or workload.get("runtime", "none") == "none":
        return "none"
    command = _command_line(workload.get("command"))
    if workload.get("runtime") == "container" and workload.get("image"):
        return f"{workload['image']} {command}".strip()
    return command or "none"


@dataclass(frozen=True)
class DeploymentState:
    """What the deployment is, in the words of :class:`DeploymentStatus` (the API's ``status``,
    the tray and Capacity say the same), and what it is doing besides (``note``: deleting,
    degraded, applying, starting), each with its badge colour."""

    status: str
    label: str
    tone: str  # good | info | warn | bad
    note: str = ""
    note_tone: str = ""
    fits: str = ""  # unplaced: how many fit now ("all 3 fit now")
    reason: str = ""  # waiting: the engine's main reason (or the team's quota)


_STATUS_TONES = {
    DeploymentStatus.UNPLACED: "info",
    DeploymentStatus.WAITING: "warn",
    DeploymentStatus.PLACED: "good",
    DeploymentStatus.RUNNING: "good",
}


def deployment_state(
    *,
    deleting: bool,
    runtime: str,
    wanted: int,
    placed: int,
    running: int,
    applying: int,
    failing: int,
    fit: TrayFit | None = None,
) -> DeploymentState:
    """``fit``: what fits now of its unplaced replicas (:func:`fleet.web.tray.deployment_fits`);
    none given, nothing does."""
    status = deployment_status(
        wanted=wanted,
        placed=placed,
        running=running,
        runtime=runtime,
        fits_now=fit is not None and fit.fits > 0,
    )
    note, note_tone = "", ""
    if deleting:
        note, note_tone = "deleting", "warn"
    elif failing:
        note, note_tone = "degraded", "bad"
    elif applying:
        note, note_tone = "applying", "info"
    elif placed and runtime != "none" and running < min(placed, wanted):
        note, note_tone = "starting", "info"
    waiting = status == DeploymentStatus.WAITING
    return DeploymentState(
        status=status.value,
        label=status.label,
        tone=_STATUS_TONES[status],
        note=note,
        note_tone=note_tone,
        fits=fit.label if fit is not None and status == DeploymentStatus.UNPLACED else "",
        reason=(fit.reason if fit is not None else "") if waiting else "",
    )


@dataclass(frozen=True)
class DeploymentRow:
    """One row of the deployments list."""

    id: int
    name: str
    kind: str
    request: str
    runtime: str
    workload: str
    wanted: int
    placed: int
    running: int
    stopping: int
    restarts: int
    state: DeploymentState
    auto_place: bool
    deleting: bool
    team: str = ""  # its team's slug
    team_id: int = 0
    spec_hidden: bool = False  # another team's, for a reader who may not see what it runs
    autoscaling: str = ""  # "auto 1-8" when a policy sets its count, else ""

    @property
    def signature(self) -> str:
        return _signature(
            self.name,
            self.team,
            self.request,
            self.workload,
            self.wanted,
            self.placed,
            self.running,
            self.stopping,
            self.restarts,
            self.state,
            self.deleting,
            self.autoscaling,
        )


def deployment_row(
    deployment: Deployment, *, sees_spec: bool = True, fit: TrayFit | None = None
) -> DeploymentRow:
    """``deployment`` from :func:`fleet.web.selectors.deployments_with_replicas`; without
    ``sees_spec`` (:func:`fleet.core.teams.can_see_spec`) its runtime only, not its image or
    command line; ``fit``: what fits now of its unplaced replicas."""
    held = list(deployment.allocations.all())
    placed = [a for a in held if a.state != AllocationState.RELEASING]
    runtime = str((deployment.workload or {}).get("runtime", "none"))
    replicas = {a.replica for a in placed}
    running = {a.replica for a in placed if a.workload_state == Ws.RUNNING}
    state = deployment_state(
        deleting=deployment.deleting,
        runtime=runtime,
        wanted=deployment.replicas,
        placed=len(replicas),
        running=len(running),
        applying=len({a.replica for a in placed if a.state == AllocationState.PENDING}),
        failing=len({a.replica for a in placed if a.workload_state in FAILED_STATES}),
        fit=fit,
    )
    return DeploymentRow(
        id=deployment.pk,
        name=deployment.name,
        kind=deployment.kind,
        request=describe_request(deployment),
        runtime=runtime,
        workload=workload_summary(deployment.workload) if sees_spec else "",
        wanted=deployment.replicas,
        placed=len(replicas),
        running=len(running),
        stopping=len({a.replica for a in held if a.state == AllocationState.RELEASING}),
        restarts=sum(a.restarts for a in placed if a.gpu_slot == 0),  # a replica counts once
        state=state,
        auto_place=deployment.auto_place,
        deleting=deployment.deleting,
        team=deployment.team.slug,
        team_id=deployment.team_id,
        spec_hidden=not sees_spec,
        autoscaling=panel.badge if (panel := autoscaling_panel(deployment)) else "",
    )


@dataclass(frozen=True)
class SpecItem:
    label: str
    value: str | None  # None: the request does not have it


def request_items(deployment: Deployment) -> list[SpecItem]:
    """The request as it was given, field by field."""
    kind = RequestKind(deployment.kind).label if deployment.kind in RequestKind.values else "?"
    items = [SpecItem("Kind", f"{kind} ({deployment.kind})")]
    if deployment.kind == RequestKind.MIG:
        items.append(SpecItem("Profile", deployment.profile or None))
    if deployment.kind == RequestKind.MPS:
        memory = deployment.memory_mib
        items.append(
            SpecItem("GPU memory", f"{format_mib(memory)} ({memory} MiB)" if memory else None)
        )
        cap = deployment.max_compute_percent
        items.append(SpecItem("Compute cap", f"{cap}% of SMs" if cap else "no cap"))
    if deployment.kind == RequestKind.GPU:
        items.append(SpecItem("GPUs per replica", str(deployment.gpu_count or 1)))
    items.append(
        SpecItem("Placement", "automatic (the engine)" if deployment.auto_place else "by hand")
    )
    return items


def workload_json(workload: Any) -> str:
    """The stored workload, every field, as JSON."""
    return json.dumps(workload if isinstance(workload, dict) else {}, indent=2, sort_keys=True)


@dataclass(frozen=True)
class ReplicaRow:
    """One replica (one GPU of it, for a multi-GPU replica), or a replica not placed."""

    replica: int
    gpu_slot: int
    placed: bool
    allocation_id: int | None = None
    gpu_id: int | None = None
    gpu_label: str = ""
    slice_label: str = ""
    allocation_state: str = ""  # pending | active | releasing
    workload_state: str = ""
    workload_state_label: str = ""
    started_at: datetime | None = None
    restarts: int | None = None
    exit_code: int | None = None
    message: str = ""
    borrowed: bool = False  # past its team's deserved share (docs/sharing.md)

    uptime_s: float | None = None  # since ``started_at``, while the workload is up

    @property
    def uptime(self) -> str:
        return format_duration(self.uptime_s) if self.uptime_s is not None else ""

    @property
    def logs_label(self) -> str:
        """How the logs panel's replica picker names this replica."""
        slot = f" · GPU {self.gpu_slot}" if self.gpu_slot else ""
        state = "releasing" if self.allocation_state == "releasing" else self.workload_state_label
        label = f"Replica {self.replica}{slot} on {self.gpu_label}"
        return f"{label} ({state})" if state else label

    @property
    def allocation_label(self) -> str:
        return _ALLOCATION_LABELS.get(self.allocation_state, ("not placed", "warn"))[0]

    @property
    def allocation_tone(self) -> str:
        return _ALLOCATION_LABELS.get(self.allocation_state, ("not placed", "warn"))[1]


# What an allocation's state means on the page, and its badge colour.
_ALLOCATION_LABELS: dict[str, tuple[str, str]] = {
    str(AllocationState.PENDING): ("applying", "info"),
    str(AllocationState.ACTIVE): ("active", "good"),
    str(AllocationState.RELEASING): ("releasing", "warn"),
}


def format_duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 4 min``, ``2 d 5 h``."""
    whole = max(0, int(seconds))
    minutes, hours, days = whole // 60, whole // 3600, whole // 86400
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{minutes} min"
    if whole < 86400:
        return f"{hours} h {minutes % 60} min"
    return f"{days} d {hours % 24} h"


def slice_label(allocation: Allocation) -> str:
    partition = allocation.partition
    if allocation.kind == RequestKind.MIG:
        end = partition.start + partition.size - 1
        where = (
            f"slice {partition.start}" if partition.size < 2 else f"slices {partition.start}-{end}"
        )
        return f"MIG {partition.profile_name or f'profile {partition.profile_id}'} · {where}"
    if allocation.kind == RequestKind.MPS:
        cap = f" · {allocation.compute_percent}% SM" if allocation.compute_percent else ""
        return f"MPS share · {format_mib(allocation.memory_mib)}{cap}"
    return "whole GPU"


def replica_rows(deployment: Deployment, *, now: datetime) -> list[ReplicaRow]:
    """Every wanted replica (placed or not), then those still releasing their slice; uptimes
    are counted to ``now``."""
    allocations = sorted(
        deployment.allocations.all(),
        key=lambda a: (a.state == AllocationState.RELEASING, a.replica, a.gpu_slot),
    )
    placed = {a.replica for a in allocations if a.state != AllocationState.RELEASING}
    rows = [_replica_row(a, now) for a in allocations if a.state != AllocationState.RELEASING]
    rows += [
        ReplicaRow(replica=r, gpu_slot=0, placed=False)
        for r in range(deployment.replicas)
        if r not in placed
    ]
    rows.sort(key=lambda r: (r.replica, r.gpu_slot))
    rows += [_replica_row(a, now) for a in allocations if a.state == AllocationState.RELEASING]
    return rows


def _replica_row(allocation: Allocation, now: datetime) -> ReplicaRow:
    gpu = allocation.gpu
    state = allocation.workload_state
    started = allocation.started_at
    up = started is not None and state in _UP_STATES
    return ReplicaRow(
        replica=allocation.replica,
        gpu_slot=allocation.gpu_slot,
        placed=True,
        allocation_id=allocation.pk,
        gpu_id=gpu.pk,
        gpu_label=f"{gpu.host.name}/gpu{gpu.index}",
        slice_label=slice_label(allocation),
        allocation_state=allocation.state,
        workload_state=state,
        workload_state_label=Ws(state).label if state in Ws.values else state,
        started_at=started,
        uptime_s=(now - started).total_seconds() if up and started is not None else None,
        restarts=allocation.restarts,
        exit_code=allocation.exit_code,
        message=allocation.workload_message,
        borrowed=allocation.borrowed,
    )
