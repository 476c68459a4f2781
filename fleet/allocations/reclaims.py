"""What a reclaim reads: the borrowed replicas of other teams it may move or stop, whether a
deployment's next replica is entitled to reclaim (within its team's deserved share), the plan
(:func:`fleet.placement.reclaim.reclaim_plan`) on the fleet as it is. The claims of the
reclaims in progress are :mod:`fleet.allocations.claims`.

Read-only. The preview (:mod:`fleet.sharing.reclaim`) and the reclaim workflow
(:mod:`fleet.workflows.reclaim`) both plan through :func:`reclaim_plan_of`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from fleet.allocations.holdings import sharing_of, team_usage
from fleet.allocations.models import Allocation, AllocationState, Deployment, RequestKind
from fleet.allocations.rankings import placed_demands, placed_requests
from fleet.allocations.selectors import fleet_snapshot, placement_demand, placement_request
from fleet.core.models import Operation, OperationKind
from fleet.core.operations import RUNNING
from fleet.core.priorities import NO_PRIORITY, effective_priority, priority_values
from fleet.placement.quota import Usage, plus, replica_demand
from fleet.placement.reclaim import Borrowed, ReclaimPlan, reclaim_plan
from fleet.placement.sharing import Sharing, sharing_verdict

NOT_ENTITLED = "reclaim.not_entitled"
_PLACED = (AllocationState.PENDING, AllocationState.ACTIVE)


@dataclass(frozen=True)
class Preview:
    """The plan, the allocations it names (by planner key: the borrowed ones it may move or
    stop, and any other replica its moves take out of the way), and why none when so."""

    plan: ReclaimPlan
    allocations: dict[tuple[str, int], Allocation]
    code: str = ""


def allocation_key(allocation: Allocation) -> tuple[str, int]:
    """How the planner names the replica (:class:`fleet.placement.defrag.Move`)."""
    if allocation.kind == RequestKind.MIG:
        return ("mig", allocation.partition_id)
    if allocation.kind == RequestKind.MPS:
        return ("mps", allocation.pk)
    return ("gpu", allocation.gpu_id)


def borrowed_of_others(team_id: int) -> tuple[list[Borrowed], dict[tuple[str, int], Allocation]]:
    """Other teams' borrowed allocations in place, as the planner sees them. A replica in the
    middle of a move (either copy) is left out: its move decides where it ends up."""
    values = priority_values()
    rows = (
        Allocation.objects.placed()
        .filter(borrowed=True, replaces__isnull=True)
        .exclude(successor__state__in=_PLACED)
        .exclude(deployment__team_id=team_id)
        .select_related("deployment__team")
    )
    found, by_key = [], {}
    for a in rows:
        d = a.deployment
        value = values.get(effective_priority(d.priority, d.team.default_priority), NO_PRIORITY)
        started = a.started_at or a.created_at
        key = allocation_key(a)
        found.append(Borrowed(key, a.gpu_id, value, started.timestamp()))
        by_key[key] = a
    return found, by_key


def within_deserved(sharing: Sharing, held: Usage, demand: Usage) -> bool:
    """Whether a replica asking ``demand`` is within its team's deserved share when the team
    holds ``held`` (pure): only such a replica reclaims."""
    verdict = sharing_verdict(sharing, held, demand, Usage(), Usage())
    return bool(sharing.deserved.bounded and verdict.allowed and not verdict.borrowed)


def entitled(deployment: Deployment, ahead: Usage | None = None) -> bool:
    """Whether the deployment's next replica is within its team's deserved share (only such a
    replica reclaims); with ``ahead``, once the team also holds that much more (its entitled
    replicas before this one in the queue, which the reclaim sweep serves first)."""
    held = team_usage(deployment.team_id)
    demand = replica_demand(placement_request(deployment))
    return within_deserved(sharing_of(deployment.team), plus(held, ahead or Usage()), demand)


def reclaim_plan_of(deployment: Deployment, avoid_gpus: Collection[int] = ()) -> Preview:
    """What a reclaim would do now for the deployment's next replica (read-only); planned away
    from ``avoid_gpus`` (the GPUs of the reclaims running): nothing placed or moved onto them,
    no borrowed replica of theirs stopped or moved."""
    if not entitled(deployment):
        none = ReclaimPlan(
            "none",
            reason="Only a replica within its team's deserved share reclaims; this one is not.",
        )
        return Preview(none, {}, NOT_ENTITLED)
    borrowed, by_key = borrowed_of_others(deployment.team_id)
    snapshot = fleet_snapshot()
    if avoid_gpus:
        avoid = set(avoid_gpus)
        borrowed = [b for b in borrowed if b.gpu_id not in avoid]
        snapshot = snapshot.with_changes(
            gpus=[replace(g, cordoned=True) for i in sorted(avoid) if (g := snapshot.gpu(i))]
        )
    plan = reclaim_plan(
        snapshot,
        placement_request(deployment),
        borrowed=borrowed,
        now_s=timezone.now().timestamp(),
        min_runtime_s=float(settings.FLEET_RECLAIM_MIN_RUNTIME_S),
        demand=placement_demand(deployment),
        requests=placed_requests(),
        demands=placed_demands(),
    )
    others = [(m.kind, m.allocation_id) for m in plan.moves if m.occupied]
    return Preview(plan, {**_allocations_of([k for k in others if k not in by_key]), **by_key})


def _allocations_of(keys: list[tuple[str, int]]) -> dict[tuple[str, int], Allocation]:
    """The placed allocations the planner names by ``keys`` (a replica a move takes out of the
    way that is not borrowed: guaranteed replicas move too, make-before-break)."""
    if not keys:
        return {}
    mig = [i for kind, i in keys if kind == "mig"]
    mps = [i for kind, i in keys if kind == "mps"]
    rows = (
        Allocation.objects.placed()
        .filter(replaces__isnull=True)
        .filter(Q(kind=RequestKind.MIG, partition_id__in=mig) | Q(kind=RequestKind.MPS, pk__in=mps))
        .select_related("deployment__team")
    )
    return {allocation_key(a): a for a in rows}


RECLAIM_LOCK = 0x5EC1A1
"""The PostgreSQL advisory lock that serialises starting reclaims and their stopping steps."""


def serialise_reclaims() -> None:
    """Take the reclaims' advisory lock until the transaction ends (PostgreSQL; SQLite
    serialises writers): a sweep starting reclaims and a reclaim choosing what it stops then
    see each other's choices, committed, and never pick the same replica or GPU."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [RECLAIM_LOCK])


def running_reclaims(exclude: int | None = None) -> tuple[set[int], set[int], bool]:
    """The running reclaims (but ``exclude``, an operation id): their claimants, the GPUs they
    touch (``payload["gpus"]``) with those the running defrags touch (the engine's for the
    queue's head, or a person's), and whether every reclaim says its GPUs (one started by an
    older server does not; a defrag started by one names none and is not kept away from)."""
    claimants: set[int] = set()
    gpus: set[int] = set()
    known = True
    rows = Operation.objects.filter(kind=OperationKind.RECLAIM, status__in=RUNNING)
    if exclude is not None:
        rows = rows.exclude(pk=exclude)
    for deployment_id, payload in rows.values_list("deployment_id", "payload"):
        if deployment_id is not None:
            claimants.add(deployment_id)
        listed = (payload or {}).get("gpus")
        if isinstance(listed, list):
            gpus.update(int(g) for g in listed)
        else:
            known = False
    defrags = Operation.objects.filter(kind=OperationKind.DEFRAG, status__in=RUNNING)
    for payload in defrags.values_list("payload", flat=True):
        listed = (payload or {}).get("gpus")
        if isinstance(listed, list):
            gpus.update(int(g) for g in listed)
    return claimants, gpus, known


def team_reclaims(team_id: int, limit: int = 20) -> list[Operation]:
    """The latest reclaims that took from the team (borrower) or gave back to it (lender)."""
    found = []
    for operation in Operation.objects.filter(kind=OperationKind.RECLAIM).order_by("-pk")[:500]:
        payload = operation.payload
        teams = {payload.get("lender", {}).get("team")}
        teams |= {b.get("team") for b in payload.get("borrowers", [])}
        if team_id in teams:
            found.append(operation)
            if len(found) >= limit:
                break
    return found
