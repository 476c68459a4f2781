"""When Fleet reclaims: beat (``fleet.reclaim``, every ``FLEET_RECLAIM_EVERY_S``, 3 s) walks the
queue in the order it is served and starts reclaims (:func:`fleet.workflows.reclaim.reclaim_start`)
for the waiting replicas that their team's deserved share entitles and that only moving or
stopping other teams' borrowed replicas would place. A replica that fits now is the engine's or
an operator's to place; a replica past its deserved share never reclaims.

Up to ``FLEET_RECLAIM_CONCURRENCY`` (8) reclaims run at once, fleet-wide, one a deployment, and
no two touch the same GPU (a move's source or destination, a stopped replica's GPU, the
claimant's target: :func:`fleet.placement.reclaim.plan_gpus`): each plans on the fleet as it is,
and none counts on capacity another is freeing. A returning team's replicas are reclaimed side
by side, not one after another. Starting is serialised (a PostgreSQL advisory lock, taken before
any row lock; SQLite serialises writers): two sweeps at once never start reclaims on one GPU. A
claimant whose reclaim failed is left alone for ``FLEET_RECLAIM_RETRY_S`` (60 s).

Besides beat, a replica left waiting for capacity kicks a sweep at once
(:func:`fleet.core.jobs.reclaim_after_commit`: a creation into the queue, an autoscaler's
scale-out, a queue run that could not place everything; at most once a second). Within a sweep,
an ask (request and demand) that found no plan is not planned again.
"""

from __future__ import annotations

import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.allocations.models import Allocation
from fleet.allocations.reclaims import entitled, running_reclaims, serialise_reclaims
from fleet.allocations.selectors import placement_demand, placement_request
from fleet.core.errors import ServiceError
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.placement.fairshare import queue_order
from fleet.sharing.queue import current_shares, waiting_replicas
from fleet.workflows.reclaim import reclaim_start

MAX_TRIED = 20
"""Entitled deployments one sweep plans for at most (each plan runs the move planner)."""
MAX_LOOKED_AT = 1000
"""Waiting deployments one sweep looks at, at most, to find the entitled ones."""
PLAN_BUDGET_S = 2.0
"""A sweep stops planning once its plans took this long (a plan runs the move planner on the
whole fleet: about a second at a thousand GPUs); the next beat goes on."""


def _recently_failed() -> set[int]:
    since = timezone.now() - timedelta(seconds=float(settings.FLEET_RECLAIM_RETRY_S))
    return set(
        Operation.objects.filter(
            kind=OperationKind.RECLAIM,
            status__in=(OperationStatus.FAILED, OperationStatus.EXPIRED),
            finished_at__gte=since,
        )
        .exclude(deployment=None)
        .values_list("deployment_id", flat=True)
    )


def reclaims_start() -> list[int]:
    """Start the reclaims that are needed, beside those running (at most
    ``FLEET_RECLAIM_CONCURRENCY`` at once, on disjoint GPUs); returns the operations started."""
    if not Allocation.objects.placed().filter(borrowed=True).exists():
        return []  # nothing borrowed: nothing to reclaim (one query on most beats)
    limit = max(1, int(settings.FLEET_RECLAIM_CONCURRENCY))
    started_ops: list[int] = []
    with transaction.atomic():
        serialise_reclaims()
        claimants, busy, known = running_reclaims()
        if len(claimants) >= limit or (claimants and not known):
            return []
        waiting, deployments = waiting_replicas()
        if not waiting:
            return []
        skipped = _recently_failed()
        started = time.monotonic()
        seen: set[int] = set()
        # Asks (request and demand, the team among them) that no plan placed: within a sweep
        # the fleet only loses options (each reclaim started cordons its GPUs for the next).
        no_gain: set[str] = set()
        planned = 0
        for queued in queue_order(waiting, current_shares()):
            deployment = deployments[queued.waiting.deployment_id]
            if deployment.pk in seen or deployment.pk in skipped or deployment.pk in claimants:
                continue
            seen.add(deployment.pk)
            if len(seen) > MAX_LOOKED_AT:
                break
            # Replicas past their team's deserved share (borrowers-to-be) may fill the head of
            # the queue: they are passed over without counting against the plans a sweep makes.
            if not deployment.team.has_quota or not entitled(deployment):
                continue
            asks = repr((placement_request(deployment), placement_demand(deployment)))
            if asks in no_gain:
                continue  # the same ask found no plan in this sweep: nor would this one
            if planned >= MAX_TRIED or (planned and time.monotonic() - started > PLAN_BUDGET_S):
                break
            planned += 1
            try:
                with transaction.atomic():
                    operation = reclaim_start(deployment_id=deployment.pk, avoid_gpus=busy)
            except ServiceError as error:  # fits now, no net gain, or on a busy GPU: the next
                if error.code == "reclaim.no_gain":
                    no_gain.add(asks)
                continue
            started_ops.append(operation.pk)
            claimants.add(deployment.pk)
            busy.update(operation.payload["gpus"])
            if len(claimants) >= limit:
                break
    return started_ops
