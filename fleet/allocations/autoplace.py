"""Auto-placement: the placement engine chooses the target of each replica.

The engine ranks targets on a snapshot; the place service then re-checks under row locks, so a
stale snapshot can cost a retry but never an over-commit.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from fleet.allocations.claims import CLAIMED, claimed_gpus
from fleet.allocations.models import Deployment
from fleet.allocations.quotas import QuotaExceeded, quota_refusal
from fleet.allocations.rankings import deployment_ranking
from fleet.allocations.selectors import fleet_snapshot
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import Conflict, NotFound, RuleViolation, ServiceError
from fleet.core.jobs import reclaim_after_commit
from fleet.core.models import Operation, Team
from fleet.domain import Violation
from fleet.placement import FleetSnapshot, main_reasons

logger = logging.getLogger(__name__)

_CLAIMED = Violation(
    CLAIMED,
    "A reclaim in progress stopped a replica of this deployment to free GPUs it would fit on: "
    "it is not placed back there while the claim holds.",
)

# A stale snapshot can make the first choices fail under the locks; a few retries are enough.
MAX_ATTEMPTS = 5


def deployment_autoplace(
    *,
    deployment_id: int,
    requested_by: Any = None,
    limit: int | None = None,
    over_quota_reason: str | None = None,
) -> list[Operation]:
    """Place every unplaced replica (at most ``limit``) on the best target that accepts it.

    Raises :class:`RuleViolation` when a replica fits nowhere, and :class:`QuotaExceeded` when
    it would pass its team's quota (unless ``over_quota_reason``: a fault's re-placement,
    allowed and recorded); inside the caller's transaction that undoes the replicas placed
    before it, so auto-placement is all or nothing. Replicas another transaction places
    meanwhile (the queue, a defrag, a person) count as placed: when they were the last, it
    returns what it placed itself.
    """
    operations: list[Operation] = []
    deployment = Deployment.objects.get(pk=deployment_id)
    # One fleet snapshot for the whole batch: after each placement (or refusal) only the
    # target's host is read again. The place service checks every target against the database
    # under its locks, so a snapshot stale elsewhere costs at most a refused attempt.
    snapshot = fleet_snapshot()
    while (
        deployment.allocations.placed().values("replica").distinct().count() < deployment.replicas
    ):
        if limit is not None and len(operations) >= limit:
            break
        over_quota = quota_refusal(deployment) if over_quota_reason is None else []
        if over_quota:  # no target can change that: say so, not "no capacity"
            raise QuotaExceeded(
                Team.objects.get(pk=deployment.team_id),
                f"Placing {deployment.name}",
                over_quota,
                placed_operations=[op.pk for op in operations],
            )
        placed = False
        refusals: list[Violation] = []
        ranking = deployment_ranking(deployment, snapshot)
        refusals.extend(v for refusal in ranking.infeasible[:5] for v in refusal.violations)
        claimed = claimed_gpus(deployment_id)  # no cycling: a reclaim's freed GPUs are skipped
        feasible = [t for t in ranking.feasible if t.gpu_id not in claimed]
        if len(feasible) < len(ranking.feasible):
            refusals.append(_CLAIMED)
        for target in feasible[:MAX_ATTEMPTS]:
            try:
                with transaction.atomic():
                    operations.append(
                        deployment_place(
                            deployment_id=deployment_id,
                            partition_id=target.partition_id,
                            gpu_id=None if target.partition_id is not None else target.gpu_id,
                            start=target.new_instance.start if target.new_instance else None,
                            over_quota_reason=over_quota_reason,
                            requested_by=requested_by,
                        )
                    )
                placed = True
            except QuotaExceeded as error:  # under the team's lock: no other target helps
                error.details["placed_operations"] = [op.pk for op in operations]
                raise
            except ServiceError as error:
                if error.code == "deployment.fully_placed":  # another placer got there first
                    return operations
                refusals.extend(violations_of(error))
            finally:
                snapshot = _reread_host(snapshot, target.gpu_id)
            if placed:
                break
        if not placed:
            missing = (
                deployment.replicas
                - deployment.allocations.placed().values("replica").distinct().count()
            )
            if missing <= 0:  # placed meanwhile by another transaction (the queue, a defrag)
                break
            raise RuleViolation(
                f"No capacity for {missing} replica(s) of {deployment.name}.",
                refusals[:20]
                or [
                    Violation("placement.no_capacity", "No GPU in the fleet can take this request.")
                ],
                placed_operations=[op.pk for op in operations],
            )
    return operations


@transaction.atomic
def deployment_create_placed(
    *,
    name: str,
    request: DeploymentRequest,
    replicas: int,
    workload: Mapping[str, Any] | None = None,
    host_labels: Mapping[str, Any] | None = None,
    team_id: int | None = None,
    host_memory_mib: int | None = None,
    requested_by: Any = None,
    wait: bool = False,
) -> Deployment:
    """A new workload with every replica placed by the engine, or nothing at all (a replica that
    fits nowhere refuses the whole creation). It stays ``auto_place``: replicas added by scaling
    are placed by the engine too (:mod:`fleet.allocations.scaling`).

    With ``wait``, the replicas that fit now are placed and the others wait in the queue (none
    fitting, or its team's quota refusing, is no error): the queue places them as capacity frees
    (:func:`fleet.sharing.placing.queue_place`), and where its team's deserved share entitles
    them, a reclaim takes it back from borrowers (:mod:`fleet.sharing.reclaiming`), as a pod
    waits in Kubernetes, Kueue or Slurm."""
    deployment = deployment_create(
        name=name,
        request=request,
        replicas=replicas,
        workload=workload,
        auto_place=True,
        host_labels=host_labels,
        team_id=team_id,
        host_memory_mib=host_memory_mib,
        requested_by=requested_by,
    )
    try:
        deployment_autoplace(deployment_id=deployment.pk, requested_by=requested_by)
    except RuleViolation as error:  # QuotaExceeded too
        if not wait:
            raise  # the caller's transaction undoes the creation: all or nothing
        logger.info(
            "%s: %d of %d replica(s) placed, the others wait: %s",
            deployment.name,
            len(error.details.get("placed_operations", [])),
            replicas,
            error.message,
        )
        reclaim_after_commit()  # within its team's deserved share, a reclaim starts now
    return deployment


@dataclass(frozen=True)
class PlaceAll:
    """What "Place all" did: the place operations, the replicas left unplaced and why."""

    operations: list[Operation]
    unplaced: int
    reasons: list[Violation]


def deployment_place_all(*, deployment_id: int, requested_by: Any = None) -> PlaceAll:
    """Place every unplaced replica that fits now, one after another on the engine's best
    target (:func:`deployment_autoplace`, each replica in its own transaction). Unlike creating
    with ``auto``, it keeps what fitted when a later replica fits nowhere, and says why that one
    did not (the ranking's main refusals).

    Raises:
        NotFound: no such deployment.
        Conflict: ``deployment.deleting``, ``deployment.fully_placed``, or
            ``place_all.nothing_fits`` when not one replica fits (``details.violations``).
    """
    deployment = Deployment.objects.filter(pk=deployment_id).first()
    if deployment is None:
        raise NotFound(
            "deployment.not_found",
            f"Deployment {deployment_id} does not exist.",
            {"deployment": deployment_id},
        )
    if deployment.deleting:
        raise Conflict(
            "deployment.deleting",
            f"{deployment.name} is being deleted: its workloads are stopping.",
            {"deployment": deployment_id},
        )
    if _unplaced(deployment) == 0:
        raise Conflict(
            "deployment.fully_placed",
            f"All {deployment.replicas} replica(s) of {deployment.name} are already placed.",
            {"replicas": deployment.replicas},
        )
    try:
        operations = deployment_autoplace(deployment_id=deployment_id, requested_by=requested_by)
    except RuleViolation as error:
        placed_ids = error.details.get("placed_operations", [])
        if not placed_ids and isinstance(error, QuotaExceeded):
            raise  # the team's quota, not the fleet, refuses: 422 quota.exceeded
        operations = list(Operation.objects.filter(pk__in=placed_ids).order_by("pk"))
    unplaced = _unplaced(deployment)
    reasons = _why_not(deployment) if unplaced else []
    if not operations:
        raise Conflict(
            "place_all.nothing_fits",
            f"No replica of {deployment.name} fits now: {reasons[0].message}",
            {"violations": [v.as_dict() for v in reasons], "unplaced": unplaced},
        )
    return PlaceAll(operations=operations, unplaced=unplaced, reasons=reasons)


def _unplaced(deployment: Deployment) -> int:
    placed = deployment.allocations.placed().values("replica").distinct().count()
    return max(0, deployment.replicas - placed)


def _why_not(deployment: Deployment) -> list[Violation]:
    """The main refusals of the next replica, each with how many GPUs gave it (the team's
    quota first: no GPU can lift it)."""
    over_quota = quota_refusal(deployment)
    if over_quota:
        return over_quota
    reasons = main_reasons(deployment_ranking(deployment))
    if not reasons:
        return [Violation("placement.no_capacity", "No GPU in the fleet can take this request.")]
    return [
        Violation(
            r.violation.code, r.violation.message, {**r.violation.details, "refusals": r.refusals}
        )
        for r in reasons
    ]


def violations_of(error: ServiceError) -> list[Violation]:
    listed = error.details.get("violations") or [{"code": error.code, "message": error.message}]
    return [Violation(v["code"], v["message"], dict(v.get("details", {}))) for v in listed]


def _reread_host(snapshot: FleetSnapshot, gpu_id: int) -> FleetSnapshot:
    """``snapshot`` with the host of ``gpu_id`` read again from the database (all of it when
    that host's GPUs changed meanwhile)."""
    gpu = snapshot.gpu(gpu_id)
    if gpu is None:
        return fleet_snapshot()
    fresh = fleet_snapshot(host_ids=[gpu.host_id])
    try:
        return snapshot.with_changes(hosts=fresh.hosts, gpus=fresh.gpus)
    except KeyError:  # a GPU appeared on that host
        return fleet_snapshot()
