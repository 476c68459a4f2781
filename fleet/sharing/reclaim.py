"""The reclaim preview: what Fleet would do to place a deployment's next replica that its team's
deserved share entitles, on the fleet as it is now (:func:`fleet.placement.reclaim.reclaim_plan`,
read-only: nothing is moved or stopped here).

Only a replica within its team's deserved share may reclaim; borrowed replicas of *other* teams
are what it may move or stop.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from fleet.allocations.holdings import sharing_of, team_usage
from fleet.allocations.models import Allocation, Deployment, RequestKind
from fleet.allocations.rankings import placed_demands, placed_requests
from fleet.allocations.selectors import fleet_snapshot, placement_demand, placement_request
from fleet.core.errors import NotFound
from fleet.core.priorities import NO_PRIORITY, effective_priority, priority_values
from fleet.placement.quota import Usage, replica_demand
from fleet.placement.reclaim import Borrowed, ReclaimPlan, reclaim_plan
from fleet.placement.sharing import sharing_verdict

NOT_ENTITLED = "reclaim.not_entitled"


@dataclass(frozen=True)
class Preview:
    """The plan, the borrowed allocations it names (by planner key), and why none when so."""

    plan: ReclaimPlan
    allocations: dict[tuple[str, int], Allocation]
    code: str = ""


def _key(allocation: Allocation) -> tuple[str, int]:
    if allocation.kind == RequestKind.MIG:
        return ("mig", allocation.partition_id)
    if allocation.kind == RequestKind.MPS:
        return ("mps", allocation.pk)
    return ("gpu", allocation.gpu_id)


def borrowed_of_others(team_id: int) -> tuple[list[Borrowed], dict[tuple[str, int], Allocation]]:
    """Other teams' borrowed allocations in place, as the planner sees them."""
    values = priority_values()
    rows = (
        Allocation.objects.placed()
        .filter(borrowed=True)
        .exclude(deployment__team_id=team_id)
        .select_related("deployment__team")
    )
    found, by_key = [], {}
    for a in rows:
        d = a.deployment
        value = values.get(effective_priority(d.priority, d.team.default_priority), NO_PRIORITY)
        started = a.started_at or a.created_at
        key = _key(a)
        found.append(Borrowed(key, a.gpu_id, value, started.timestamp()))
        by_key[key] = a
    return found, by_key


def reclaim_preview(deployment_id: int) -> Preview:
    """What a reclaim would do for the deployment's next replica (raises 404 for none)."""
    deployment = Deployment.objects.select_related("team").filter(pk=deployment_id).first()
    if deployment is None:
        raise NotFound(
            "deployment.not_found",
            f"Deployment {deployment_id} does not exist.",
            {"deployment": deployment_id},
        )
    sharing = sharing_of(deployment.team)
    demand = replica_demand(placement_request(deployment))
    verdict = sharing_verdict(sharing, team_usage(deployment.team_id), demand, Usage(), Usage())
    if not sharing.deserved.bounded or verdict.borrowed or not verdict.allowed:
        none = ReclaimPlan(
            "none",
            reason="Only a replica within its team's deserved share reclaims; this one is not.",
        )
        return Preview(none, {}, NOT_ENTITLED)
    borrowed, by_key = borrowed_of_others(deployment.team_id)
    plan = reclaim_plan(
        fleet_snapshot(),
        placement_request(deployment),
        borrowed=borrowed,
        now_s=timezone.now().timestamp(),
        min_runtime_s=float(settings.FLEET_RECLAIM_MIN_RUNTIME_S),
        demand=placement_demand(deployment),
        requests=placed_requests(),
        demands=placed_demands(),
    )
    return Preview(plan, by_key)
