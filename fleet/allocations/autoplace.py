"""Auto-placement: the placement engine chooses the target of each replica.

The engine ranks targets on a snapshot; the place service then re-checks under row locks, so a
stale snapshot can cost a retry but never an over-commit.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from fleet.allocations.models import Deployment
from fleet.allocations.selectors import deployment_ranking
from fleet.allocations.services import deployment_place
from fleet.core.errors import RuleViolation, ServiceError
from fleet.domain import Violation
from fleet.partitioning.models import Operation

logger = logging.getLogger(__name__)

# A stale snapshot can make the first choices fail under the locks; a few retries are enough.
MAX_ATTEMPTS = 5


def deployment_autoplace(
    *, deployment_id: int, requested_by: Any = None, limit: int | None = None
) -> list[Operation]:
    """Place every unplaced replica (at most ``limit``) on the best target that accepts it.

    Raises :class:`RuleViolation` when a replica fits nowhere; inside the caller's transaction
    that undoes the replicas placed before it, so auto-placement is all or nothing.
    """
    operations: list[Operation] = []
    deployment = Deployment.objects.get(pk=deployment_id)
    while deployment.allocations.values("replica").distinct().count() < deployment.replicas:
        if limit is not None and len(operations) >= limit:
            break
        placed = False
        refusals: list[Violation] = []
        ranking = deployment_ranking(deployment)
        refusals.extend(v for refusal in ranking.infeasible[:5] for v in refusal.violations)
        for target in ranking.feasible[:MAX_ATTEMPTS]:
            try:
                with transaction.atomic():
                    operations.append(
                        deployment_place(
                            deployment_id=deployment_id,
                            partition_id=target.partition_id,
                            gpu_id=None if target.partition_id is not None else target.gpu_id,
                            start=target.new_instance.start if target.new_instance else None,
                            requested_by=requested_by,
                        )
                    )
                placed = True
                break
            except ServiceError as error:
                refusals.extend(_violations(error))
        if not placed:
            missing = (
                deployment.replicas - deployment.allocations.values("replica").distinct().count()
            )
            raise RuleViolation(
                f"No capacity for {missing} replica(s) of {deployment.name}.",
                refusals[:20]
                or [
                    Violation("placement.no_capacity", "No GPU in the fleet can take this request.")
                ],
                placed_operations=[op.pk for op in operations],
            )
    return operations


def _violations(error: ServiceError) -> list[Violation]:
    listed = error.details.get("violations") or [{"code": error.code, "message": error.message}]
    return [Violation(v["code"], v["message"], dict(v.get("details", {}))) for v in listed]
