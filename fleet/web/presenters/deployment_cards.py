"""A deployment card of the tray: its request in words, its replicas placed, running and
stopping, and what fits now of those not placed."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from fleet.allocations.models import (
    FAILED_STATES,
    AllocationState,
    Deployment,
    describe_request,
)
from fleet.allocations.states import DeploymentStatus, deployment_status


@dataclass(frozen=True)
class TrayFit:
    """What fits now of a deployment's unplaced replicas.

    ``fits`` replicas fit now, placed one after another (``capped``: at least that many; the
    engine stopped counting); ``best`` says where the next one goes; ``reason`` is the main
    refusal when none fits (``reason_code``, and ``refusals``: how many GPUs gave it).
    """

    unplaced: int
    fits: int
    capped: bool = False
    best: str = ""
    reason_code: str = ""
    reason: str = ""
    refusals: int = 0

    @property
    def label(self) -> str:
        if self.capped:
            return f"{self.fits}+ of {self.unplaced} fit now"
        if self.fits == self.unplaced:
            return f"all {self.fits} fit now" if self.fits > 1 else "fits now"
        return f"{self.fits} of {self.unplaced} fit now"

    @property
    def signature(self) -> tuple[object, ...]:
        return (self.fits, self.capped, self.best, self.reason_code, self.reason)


@dataclass(frozen=True)
class DeploymentCard:
    id: int
    name: str
    kind: str
    request: str
    replicas: int
    placed: int
    pending: int
    targets: list[str]
    runtime: str = "none"
    running: int = 0
    stopping: int = 0
    failing: int = 0
    deleting: bool = False
    fit: TrayFit | None = None  # what fits now of the unplaced replicas (the tray says it)
    team_id: int = 0
    team: str = ""  # its team's slug

    @property
    def status(self) -> str:
        """Its :class:`~fleet.allocations.states.DeploymentStatus` (the API's ``status``)."""
        return deployment_status(
            wanted=self.replicas,
            placed=self.placed,
            running=self.running,
            runtime=self.runtime,
            fits_now=self.fit is not None and self.fit.fits > 0,
        ).value

    @property
    def status_label(self) -> str:
        return DeploymentStatus(self.status).label

    @property
    def placeable(self) -> bool:
        return self.placed < self.replicas and not self.deleting

    @property
    def placed_percent(self) -> float:
        return round(100 * self.placed / self.replicas, 1) if self.replicas else 0

    @property
    def signature(self) -> str:
        state = repr(
            (
                self.name,
                self.request,
                self.replicas,
                self.placed,
                self.pending,
                self.targets,
                self.running,
                self.stopping,
                self.failing,
                self.deleting,
                self.team,
                self.fit.signature if self.fit is not None else None,
            )
        )
        return hashlib.blake2s(state.encode(), digest_size=6).hexdigest()


def deployment_card(deployment: Deployment) -> DeploymentCard:
    held = list(deployment.allocations.all())
    allocations = [a for a in held if a.state != AllocationState.RELEASING]
    replicas = {a.replica for a in allocations}
    pending = {a.replica for a in allocations if a.state == AllocationState.PENDING}
    runtime = str((deployment.workload or {}).get("runtime", "none"))
    targets = sorted(
        {f"{a.gpu.host.name}/gpu{a.gpu.index}" for a in allocations if a.gpu_id is not None}
    )
    return DeploymentCard(
        id=deployment.pk,
        name=deployment.name,
        kind=deployment.kind,
        request=describe_request(deployment),
        replicas=deployment.replicas,
        placed=len(replicas),
        pending=len(pending),
        targets=targets,
        runtime=runtime,
        running=len({a.replica for a in allocations if a.workload_state == "running"}),
        stopping=len(held) - len(allocations),
        failing=len({a.replica for a in allocations if a.workload_state in FAILED_STATES}),
        deleting=deployment.deleting,
        team_id=deployment.team_id,
        team=deployment.team.slug,
    )


@dataclass(frozen=True)
class TraySection:
    """The tray's cards of one status, under a heading in the status's words."""

    status: str
    title: str
    cards: list[DeploymentCard]


def tray_sections(cards: list[DeploymentCard]) -> list[TraySection]:
    """The cards by status (those to place first, then those waiting, then the placed ones);
    a status without cards has no section."""
    order = [
        (DeploymentStatus.UNPLACED, "Unplaced, fits now"),
        (DeploymentStatus.WAITING, "Waiting, no capacity"),
        (DeploymentStatus.PLACED, "Placed"),
    ]
    placed = {DeploymentStatus.PLACED, DeploymentStatus.RUNNING}
    found = []
    for status, title in order:
        group = placed if status == DeploymentStatus.PLACED else {status}
        chosen = [c for c in cards if c.status in group]
        if chosen:
            found.append(TraySection(status.value, title, chosen))
    return found
