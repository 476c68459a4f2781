"""Which team owns a deployment, and handing it to another.

A deployment moves to another team whole: its replicas stay where they are, the new team's
quota must hold what they hold (422 ``quota.exceeded`` otherwise, changing nothing), and
chargeback splits at the change: every open usage interval of its replicas ends now and the
next one, billed to the new team, starts now. Lock order as every place: the deployment, then
the team; no host is locked (nothing is placed).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from fleet.allocations.models import Allocation, Deployment, UsageInterval
from fleet.allocations.quotas import (
    QuotaExceeded,
    alert_thresholds,
    sharing_of,
    team_usage,
    usage_of,
)
from fleet.allocations.services import lock_deployment
from fleet.allocations.workloads import workload_of
from fleet.core.events import publish_changed
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.core.policy import policy_enforce
from fleet.core.secrets import secrets_enforce
from fleet.core.teams import lock_team
from fleet.placement.quota import plus, quota_violations


@transaction.atomic
def deployment_set_team(
    *, deployment_id: int, team_id: int, requested_by: Any = None
) -> Operation | None:
    """Hand the deployment to team ``team_id``; ``None`` if it already belongs to it.

    Raises:
        NotFound: ``deployment.not_found``, ``team.not_found``.
        Conflict: ``deployment.deleting``.
        QuotaExceeded: the new team's quota cannot hold the replicas in place.
        RuleViolation: ``policy.*``, the new team's policy forbids its workload;
            ``secret.not_found``, it refers to a secret the new team does not have.
    """
    deployment = lock_deployment(deployment_id)
    if deployment.team_id == team_id:
        return None
    team = lock_team(team_id)
    # The new team's policy must allow what the deployment runs, as if it were created there.
    policy_enforce(
        team=team, workload=workload_of(deployment), host_memory_mib=deployment.host_memory_mib
    )
    # Its secret references then name the new team's secrets, which must exist.
    secrets_enforce(team=team, workload=workload_of(deployment))
    held = usage_of(Allocation.objects.placed().filter(deployment=deployment))
    if team.shares_bounded:  # its cap: the limit where set, else the deserved share
        quota, before = sharing_of(team).cap(), team_usage(team.pk)
        violations = quota_violations(quota, before, held)
        if violations:
            raise QuotaExceeded(team, f"Handing {deployment.name} to team {team.name}", violations)
        alert_thresholds(team, quota, before, plus(before, held))  # 90 % / full, as a place
    old = deployment.team
    Deployment.objects.filter(pk=deployment.pk).update(team=team)
    now = timezone.now()
    ongoing = list(
        UsageInterval.objects.select_for_update().filter(
            deployment_id=deployment.pk, ended_at__isnull=True
        )
    )
    UsageInterval.objects.filter(pk__in=[i.pk for i in ongoing]).update(ended_at=now)
    for interval in ongoing:
        interval.pk = None
        interval.team_id, interval.team_name = team.pk, team.name
        interval.started_at, interval.ended_at = now, None
    UsageInterval.objects.bulk_create(ongoing)
    operation = operation_record(
        kind=OperationKind.TEAM,
        summary=f"{deployment.name} handed from team {old.name} to team {team.name}",
        requested_by=requested_by,
        deployment=deployment,
        status=OperationStatus.SUCCEEDED,
        payload={"from_team": old.pk, "to_team": team.pk, "intervals": len(ongoing)},
    )
    publish_changed("deployment", [deployment.pk])
    return operation
