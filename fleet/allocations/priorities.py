"""Deleting a priority class: refused while a deployment or a team names it (the classes
themselves and their other writes: :mod:`fleet.core.priorities`)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from fleet.allocations.models import Deployment
from fleet.core.errors import Conflict
from fleet.core.models import Team
from fleet.core.priorities import priority_audit, priority_class_get


@transaction.atomic
def priority_class_delete(*, name: str, requested_by: Any = None) -> None:
    """Delete a class that no deployment and no team names (else 409 ``priority.in_use``)."""
    priority = priority_class_get(name)
    deployments = Deployment.objects.filter(priority=name)
    teams = Team.objects.filter(default_priority=name)
    if deployments.exists() or teams.exists():
        raise Conflict(
            "priority.in_use",
            f"Priority class {name} is named by deployments or teams: change them first.",
            {
                "deployments": list(deployments.values_list("pk", flat=True)[:20]),
                "teams": list(teams.values_list("pk", flat=True)[:20]),
            },
        )
    priority.delete()
    priority_audit(f"Deleted priority class {name}", requested_by, name=name)
