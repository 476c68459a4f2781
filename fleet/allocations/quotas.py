"""Team quotas on the place path: a team's usage, the preview's verdict, and the check that runs
in the transaction that writes a replica's allocation.

A team's quota is its deserved share; with a ``limit`` it may hold more, *borrowed*, on
capacity no other team's deserved share needs now (:mod:`fleet.allocations.borrowing`, the rule
in :mod:`fleet.placement.sharing`). A team with a quota or a limit serialises its placements on
its row (``select_for_update``), taken after the deployment's row and before any host or GPU
row (the lock order of every place), so two concurrent placements of one team cannot both pass
its cap. A team with neither takes no lock: its placements race only on their hosts, as before.

What counts: the replicas in place (pending or active), not those releasing their slice, and
the new copies of the team's moves in flight but one. A move's new copy runs beside the copy it
replaces until it runs; as Kubernetes' ``maxSurge`` meets a ``ResourceQuota``, each team has
ONE surge replica: its oldest move in flight is not counted, and every other move's new copy
counts against the quota until the move ends. So a team at its quota can still move one replica
at a time, one with headroom moves as many as fit in it, and no team holds more than its quota
plus one replica. A plain move (an operator's, a rolling update's) past that is refused
(:func:`move_quota_check`); the fleet's own moves (drains, maintenance, a fault's re-placement,
repack and defragmentation) pass it, each time recorded as an ``over_quota`` operation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from fleet.allocations.borrowing import admission
from fleet.allocations.holdings import (  # quota_of, team_usage, usage_of: re-exported
    MovingCopy,
    moving_copies,
    quota_of,
    sharing_of,
    team_usage,
    usage_of,
)
from fleet.allocations.models import Deployment
from fleet.allocations.selectors import placement_request
from fleet.core.alerts import QUOTA_EXCEEDED, QUOTA_WARNING, alert_emit
from fleet.core.errors import RuleViolation
from fleet.core.models import Operation, OperationKind, OperationStatus, Team
from fleet.core.operations import RUNNING, operation_record
from fleet.domain import Violation
from fleet.placement.quota import (
    Quota,
    Usage,
    plus,
    quota_shares,
    quota_violations,
    replica_demand,
)

logger = logging.getLogger(__name__)

__all__ = [
    "MovingCopy",
    "QuotaExceeded",
    "alert_thresholds",
    "move_quota_check",
    "quota_check",
    "quota_of",
    "quota_refusal",
    "quota_refusals",
    "sharing_of",
    "team_usage",
    "usage_of",
]


class QuotaExceeded(RuleViolation):
    """422 ``quota.exceeded``: ``details`` names the first limit broken (``limit``, ``quota``,
    ``in_use``, ``requested``) and ``violations`` lists every one; ``note`` ends the message."""

    def __init__(
        self, team: Team, what: str, violations: list[Violation], note: str = "", **extra: Any
    ) -> None:
        first = violations[0]
        super().__init__(
            f"{what} would pass team {team.name}'s quota: {first.message}"
            + (f" {note}" if note else ""),
            violations,
            team=team.pk,
            **first.details,
            **extra,
        )


def quota_refusal(deployment: Deployment) -> list[Violation]:
    """The rules the deployment's next replica would break now: its team's cap (its limit, else
    its deserved share) or, past its deserved share, borrowing what other teams need (no lock:
    the drag preview and auto-placement's early answer; the place service decides under the
    team's lock)."""
    return quota_refusals([deployment]).get(deployment.pk, [])


def quota_refusals(deployments: Iterable[Deployment]) -> dict[int, list[Violation]]:
    """:func:`quota_refusal` of many deployments (the tray), each bounded team read once."""
    teams: dict[int, Team] = {}
    usage: dict[int, Usage] = {}
    refusals: dict[int, list[Violation]] = {}
    for deployment in deployments:
        team = teams.get(deployment.team_id) or Team.objects.get(pk=deployment.team_id)
        teams[team.pk] = team
        if not team.shares_bounded:
            continue
        if team.pk not in usage:
            usage[team.pk] = team_usage(team.pk)
        demand = replica_demand(placement_request(deployment))
        verdict = admission(team, usage[team.pk], demand)
        if verdict.violations:
            refusals[deployment.pk] = list(verdict.violations)
    return refusals


def quota_check(
    *,
    deployment: Deployment,
    replica: int,
    over_quota_reason: str | None = None,
    requested_by: Any = None,
) -> bool:
    """Refuse (:class:`QuotaExceeded`) a replica past its team's cap (its limit, else its
    deserved share), or past its deserved share on capacity other teams' deserved shares need
    now (``quota.borrow_unavailable``); answer whether it is *borrowed* (past the deserved
    share). Call inside the placing transaction, after :func:`lock_deployment` and before any
    host lock: the team's row lock makes its limit race-safe.

    ``over_quota_reason``: a fault's re-placement, which may pass the quota while the fault
    lasts; it is allowed and recorded as an ``over_quota`` operation, never silently."""
    team = Team.objects.filter(pk=deployment.team_id).first()
    if team is None or not team.shares_bounded:
        return False
    team = Team.objects.select_for_update().get(pk=team.pk)
    before = team_usage(team.pk)
    demand = replica_demand(placement_request(deployment))
    verdict = admission(team, before, demand)
    if verdict.allowed:
        alert_thresholds(team, sharing_of(team).cap(), before, plus(before, demand))
        return verdict.borrowed
    if over_quota_reason is None:
        raise QuotaExceeded(team, f"Placing {deployment.name}[{replica}]", list(verdict.violations))
    _record_over_quota(
        team,
        deployment,
        f"{deployment.name}[{replica}] re-placed",
        list(verdict.violations),
        over_quota_reason,
        requested_by,
    )
    return verdict.borrowed


def move_quota_check(
    *,
    deployment: Deployment,
    replica: int,
    over_quota_reason: str | None = None,
    requested_by: Any = None,
) -> None:
    """Refuse (:class:`QuotaExceeded`) a move whose new copy the team's quota cannot count. Call
    inside the moving transaction, after :func:`lock_deployment` and before any host lock (the
    lock order of :func:`quota_check`).

    The team's first move in flight is its surge replica and is not counted: a move while no
    other move of the team is in flight always passes. Otherwise the new copy counts, as do the
    other moves' copies but the surge (:func:`team_usage`), and must fit in the quota.

    ``over_quota_reason``: a move the fleet makes (a drain, maintenance, a fault, repack,
    defragmentation), which may pass the quota; it is allowed and recorded as an
    ``over_quota`` operation, never silently."""
    team = Team.objects.filter(pk=deployment.team_id).first()
    if team is None or not team.shares_bounded:
        return
    team = Team.objects.select_for_update().get(pk=team.pk)
    moving = moving_copies(team.pk)
    if not moving:
        return  # this move is the team's surge replica
    demand = replica_demand(placement_request(deployment))
    violations = quota_violations(sharing_of(team).cap(), team_usage(team.pk, moving), demand)
    if not violations:
        return
    name = f"{deployment.name}[{replica}]"
    if over_quota_reason is None:
        surge = moving[0]
        operations = _move_operations(moving)
        surge_operation = operations.get(surge.allocation_ids[0])
        where = f" (operation {surge_operation})" if surge_operation is not None else ""
        raise QuotaExceeded(
            team,
            f"Moving {name}",
            violations,
            note=f"The team's one surge replica is in use by the move of {surge.label}{where}: "
            "past it, a move's new copy counts against the quota until the move ends. Move "
            "it once that move has ended.",
            surge_in_use=True,
            moving=[
                {
                    "deployment": copy.deployment_id,
                    "replica": copy.replica,
                    "operation": operations.get(copy.allocation_ids[0]),
                }
                for copy in moving[:MAX_LISTED]
            ],
        )
    _record_over_quota(
        team, deployment, f"{name} moved", violations, over_quota_reason, requested_by
    )


MAX_LISTED = 20
"""Moves in flight a refusal lists at most."""


def _move_operations(moving: list[MovingCopy]) -> dict[int, int]:
    """The running ``move`` operation of each copy, by the copy's first allocation."""
    firsts = {copy.allocation_ids[0] for copy in moving}
    found: dict[int, int] = {}
    running = Operation.objects.filter(
        kind=OperationKind.MOVE,
        status__in=RUNNING,
        deployment_id__in={copy.deployment_id for copy in moving},
    ).values_list("pk", "payload")
    for pk, payload in running:
        target = payload.get("to_allocation") if isinstance(payload, dict) else None
        if target in firsts:
            found[int(target)] = pk
    return found


def _record_over_quota(
    team: Team,
    deployment: Deployment,
    what: str,
    violations: list[Violation],
    reason: str,
    requested_by: Any,
) -> None:
    logger.warning("%s over team %s's quota: %s", what, team.name, violations[0].message)
    alert_emit(
        event=QUOTA_EXCEEDED,
        summary=f"Team {team.name} is over its quota: {violations[0].message}",
        subject={"team": {"id": team.pk, "name": team.name}, "reason": reason},
    )
    operation_record(
        kind=OperationKind.OVER_QUOTA,
        summary=f"{what} over team {team.name}'s quota",
        requested_by=requested_by,
        deployment=deployment,
        status=OperationStatus.SUCCEEDED,
        reason=f"{reason}: {violations[0].message}",
        payload={"team": team.pk, "violations": [v.as_dict() for v in violations]},
    )


def alert_thresholds(team: Team, quota: Quota, before: Usage, after: Usage) -> None:
    """Webhooks hear when a placement takes a limit of the team to 90 % (``quota.warning``) or
    to 100 % (``quota.exceeded``: full, the next replica is refused), once per crossing."""
    was, now = quota_shares(quota, before), quota_shares(quota, after)
    for limit, share in now.items():
        for threshold, event in ((1.0, QUOTA_EXCEEDED), (0.9, QUOTA_WARNING)):
            if was.get(limit, 0.0) < threshold <= share:
                alert_emit(
                    event=event,
                    summary=f"Team {team.name} is at {share:.0%} of its {limit} quota",
                    subject={
                        "team": {"id": team.pk, "name": team.name},
                        "limit": limit,
                        "share": round(share, 4),
                    },
                )
                break  # the highest threshold crossed says it
