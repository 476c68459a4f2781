"""What a deployment is, in one vocabulary for the API's ``status``, the tray, the deployments
list, the deployment page and Capacity.

A deployment with replicas not placed is *unplaced, fits now* (the engine has a place for the
next one: place it) or *waiting, no capacity* (it has none, or the team's quota refuses it); one
with every replica placed is *running* when every replica's workload runs, else *placed*.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import models

from fleet.allocations.models import AllocationState, Deployment, WorkloadState
from fleet.allocations.quotas import quota_refusals
from fleet.allocations.rankings import deployments_fit_now


class DeploymentStatus(models.TextChoices):
    UNPLACED = "unplaced", "unplaced, fits now"
    WAITING = "waiting", "waiting, no capacity"
    PLACED = "placed", "placed"
    RUNNING = "running", "running"


STATUS_HELP = (
    "`unplaced`: replicas are not placed and the next one fits now (place it); `waiting`: "
    "replicas are not placed and none fits (no capacity, or the team's quota); `placed`: every "
    "replica is placed; `running`: every replica is placed and its workload runs."
)


def deployment_status(
    *, wanted: int, placed: int, running: int, runtime: str, fits_now: bool
) -> DeploymentStatus:
    """The status of a deployment of ``wanted`` replicas, ``placed`` of them placed and
    ``running`` running; ``fits_now``: whether the next unplaced replica fits now. Scaled to
    zero, nothing is left to place and nothing runs: placed."""
    if placed < wanted:
        return DeploymentStatus.UNPLACED if fits_now else DeploymentStatus.WAITING
    if runtime != "none" and 0 < wanted <= running:
        return DeploymentStatus.RUNNING
    return DeploymentStatus.PLACED


def replica_counts(deployment: Deployment) -> tuple[int, int]:
    """Replicas placed and running (its allocations read once; releasing ones do not count)."""
    held = [a for a in deployment.allocations.all() if a.state != AllocationState.RELEASING]
    running = {a.replica for a in held if a.workload_state == WorkloadState.RUNNING}
    return len({a.replica for a in held}), len(running)


def deployments_fitting_now(wanted: Iterable[tuple[Deployment, int]]) -> set[int]:
    """Of ``(deployment, unplaced)`` pairs, the ids of those whose next replica fits now (one
    fleet snapshot for all; a team's quota that refuses it means it does not)."""
    wanted = [(d, n) for d, n in wanted if n > 0]
    over_quota = quota_refusals(d for d, _ in wanted)
    fits = deployments_fit_now([(d, n) for d, n in wanted if d.pk not in over_quota], limit=1)
    return {pk for pk, fit in fits.items() if fit.fits}


def deployment_statuses(deployments: Iterable[Deployment]) -> dict[int, DeploymentStatus]:
    """:func:`deployment_status` of each deployment (allocations prefetched)."""
    found = [(d, *replica_counts(d)) for d in deployments]
    fitting = deployments_fitting_now((d, d.replicas - placed) for d, placed, _ in found)
    return {
        d.pk: deployment_status(
            wanted=d.replicas,
            placed=placed,
            running=running,
            runtime=str((d.workload or {}).get("runtime", "none")),
            fits_now=d.pk in fitting,
        )
        for d, placed, running in found
    }
