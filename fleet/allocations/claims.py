"""Reclaim claims: no cycling. A replica stopped by a reclaim is not placed back onto the GPUs it
left while the reclaim that stopped it runs (the claim holds until the claimant is placed, or the
reclaim ends). A reclaim in progress names them in its payload: ``claims``, each
``{"deployment": id, "gpus": [id, ...]}``; every placement and every move's new copy
(:func:`fleet.allocations.reservations.reserve_target`) refuses such a GPU for that deployment,
and auto-placement skips it."""

from __future__ import annotations

from fleet.core.models import Operation, OperationKind
from fleet.core.operations import RUNNING
from fleet.domain import Violation

CLAIMED = "reclaim.claimed"


def claimed_gpus(deployment_id: int) -> set[int]:
    """The GPUs the deployment's replicas may not be placed on now."""
    gpus: set[int] = set()
    running = Operation.objects.filter(kind=OperationKind.RECLAIM, status__in=RUNNING)
    for payload in running.values_list("payload", flat=True):
        for claim in payload.get("claims", []):
            if claim.get("deployment") == deployment_id:
                gpus.update(claim.get("gpus", []))
    return gpus


def claim_violation(deployment_id: int, gpu_id: int) -> Violation | None:
    """Why the deployment may not take ``gpu_id`` now (``reclaim.claimed``), or ``None``."""
    if gpu_id not in claimed_gpus(deployment_id):
        return None
    return Violation(
        CLAIMED,
        "A reclaim in progress stopped a replica of this deployment to free this GPU for "
        "another team's deserved share: it is not placed back there while the claim holds.",
        {"gpu": gpu_id},
    )
