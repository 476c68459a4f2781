"""Proposals for a deployment's next replicas, read on the fleet snapshot: every target ranked
(the API, the drag preview, auto-placement), what fits now (the tray) and the fewest moves of
other replicas that would make room (the defrag plan).

Reads without locks; the place service re-checks every choice under row locks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleet.allocations.models import Allocation, Deployment, RequestKind
from fleet.allocations.selectors import (
    fleet_snapshot,
    placement_demand,
    placement_demands,
    placement_request,
    request_mix,
)
from fleet.domain import Violation
from fleet.placement import (
    Demand,
    FleetSnapshot,
    MovePlan,
    PlacementRequest,
    Ranking,
    Target,
    main_reasons,
    place_in_turn,
    plan_moves,
    rank,
)


def deployment_ranking(deployment: Deployment, snapshot: FleetSnapshot | None = None) -> Ranking:
    """Every target of the deployment's next replica, best first (the default strategy, against
    the fleet's request mix), with the reason for every target that does not fit: the API, the
    drag preview and auto-placement all read this."""
    return rank(
        snapshot or fleet_snapshot(),
        placement_request(deployment),
        mix=request_mix(),
        demand=placement_demand(deployment),
    )


FIT_NOW_LIMIT = 32
"""Replicas of one deployment the tray places in turn on the snapshot at most (beyond it, the
count is a lower bound: "32+")."""


@dataclass(frozen=True)
class FitNow:
    """What fits now of a deployment's unplaced replicas, placed one after another.

    Attributes:
        unplaced: replicas not placed yet.
        fits: how many of them fit now (at most :data:`FIT_NOW_LIMIT`; ``capped``: at least).
        best: the engine's best target for the next replica, ``None`` when nothing fits.
        reasons: when nothing fits, the main refusals and how many GPUs gave each.
    """

    unplaced: int
    fits: int
    capped: bool
    best: Target | None
    reasons: tuple[tuple[Violation, int], ...] = ()


def deployments_fit_now(
    wanted: Iterable[tuple[Deployment, int]], *, limit: int = FIT_NOW_LIMIT
) -> dict[int, FitNow]:
    """For each deployment with unplaced replicas (``(deployment, unplaced)``), how many fit now
    and where the next one goes: one fleet snapshot and one request mix for all of them, each
    deployment counted on its own (as if it were placed first)."""
    wanted = [(d, n) for d, n in wanted if n > 0]
    if not wanted:
        return {}
    snapshot, mix = fleet_snapshot(), request_mix()
    demands = placement_demands(d for d, _ in wanted)
    found: dict[int, FitNow] = {}
    for deployment, unplaced in wanted:
        count = min(unplaced, limit)
        turns = place_in_turn(
            snapshot,
            placement_request(deployment),
            count,
            mix=mix,
            demand=demands[deployment.pk],
        )
        fits = len(turns.targets)
        reasons = (
            () if fits else tuple((r.violation, r.refusals) for r in main_reasons(turns.first))
        )
        found[deployment.pk] = FitNow(
            unplaced=unplaced,
            fits=fits,
            capped=fits == count < unplaced,
            best=turns.targets[0] if fits else None,
            reasons=reasons,
        )
    return found


def deployment_defrag_plan(deployment: Deployment) -> MovePlan:
    """The fewest moves of other replicas that would let the next replica fit (a proposal)."""
    return plan_moves(
        fleet_snapshot(),
        placement_request(deployment),
        demand=placement_demand(deployment),
        requests=placed_requests(),
        demands=placed_demands(),
    )


def placed_demands() -> dict[tuple[str, int], Demand]:
    """Each placed MIG and MPS replica's demand by the defrag planner's key (as
    :func:`placed_requests`): the replicas a plan moves out of the way go only where they may
    run (their runtime, labels, their team's reserved hosts)."""
    rows = list(
        Allocation.objects.placed()
        .filter(kind__in=[RequestKind.MIG, RequestKind.MPS])
        .select_related("deployment")
    )
    demands = placement_demands({a.deployment_id: a.deployment for a in rows}.values())
    found: dict[tuple[str, int], Demand] = {}
    for allocation in rows:
        if allocation.kind == RequestKind.MPS:
            found[("mps", allocation.pk)] = demands[allocation.deployment_id]
        elif allocation.partition_id is not None:
            found[("mig", allocation.partition_id)] = demands[allocation.deployment_id]
    return found


def placed_requests() -> dict[tuple[str, int], PlacementRequest]:
    """Each placed MIG and MPS replica's request as its deployment declares it, by the defrag
    planner's key (``("mig", partition)``, ``("mps", allocation)``): a MIG profile by name,
    since its id names another profile on another product."""
    found: dict[tuple[str, int], PlacementRequest] = {}
    by_deployment: dict[int, PlacementRequest] = {}
    rows = Allocation.objects.placed().filter(kind__in=[RequestKind.MIG, RequestKind.MPS])
    for allocation in rows.select_related("deployment"):
        deployment = allocation.deployment
        if deployment.pk not in by_deployment:
            by_deployment[deployment.pk] = placement_request(deployment)
        if allocation.kind == RequestKind.MPS:
            found[("mps", allocation.pk)] = by_deployment[deployment.pk]
        elif allocation.partition_id is not None:
            found[("mig", allocation.partition_id)] = by_deployment[deployment.pk]
    return found
