"""Changing a deployment after its creation: its replica count, or its workload (a rolling
update: :mod:`fleet.allocations.deployment_rollouts`).

Scaling up adds replicas that wait in the tray, unless the deployment is auto-placed (created
with ``auto``): then the engine places them at once with the default strategy, all or none, as it
does at creation. Scaling down stops the newest replicas first: every replica whose index is at
or past the new count leaves through the eviction path, so one whose workload may still run
keeps its slice, ``releasing``, until its agent has stopped it. Both take the locks placement
takes (the deployment row, then the host rows in id order): a scale serialises with every
placement, eviction or other scale of the same deployment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.utils import timezone

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.deployment_rollouts import deployment_rollout_start
from fleet.allocations.models import Deployment
from fleet.allocations.ownership import deployment_set_team
from fleet.allocations.services import allocations_evict, lock_deployment
from fleet.core.errors import ServiceError
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import operation_record

CHANGEABLE = frozenset({"replicas", "workload", "rollout", "team"})
ROLLOUT_FIELDS = frozenset({"max_surge", "max_unavailable", "timeout_s", "min_ready_s"})
MIN_REPLICAS = 1
MAX_REPLICAS = 1000  # the ``deployment_replicas_range`` constraint

# Fields of a deployment fixed at its creation: a new request is a new deployment.
FIXED_FIELDS = frozenset(
    {
        "name",
        "kind",
        "profile",
        "memory_mib",
        "max_compute_percent",
        "gpu_count",
        "auto",
        "host_labels",
        "host_memory_mib",
    }
)
# Fields the API shows that no client writes.
READ_ONLY_FIELDS = frozenset(
    {
        "id",
        "auto_place",
        "placed_replicas",
        "running_replicas",
        "status",
        "deleting",
        "created_at",
    }
)


def deployment_update(
    *, deployment_id: int, changes: Mapping[str, Any], requested_by: Any = None
) -> Operation | None:
    """Apply a partial update (``PATCH``): ``replicas`` scales; ``workload`` (with optional
    ``rollout`` settings) starts a rolling update; ``team`` (an id, resolved and authorised by
    the caller) hands the deployment to that team. One of them at a time.

    Refuses, changing nothing: ``deployment.one_change`` (both at once),
    ``deployment.field_immutable`` (the request, the name and read-only fields),
    ``deployment.field_unknown``, ``deployment.replicas_required`` and
    ``deployment.replicas_invalid``. Returns the ``scale`` or ``rollout`` operation, or ``None``
    when the count is already the one asked for.
    """
    _check_fields(changes)
    if "team" in changes:
        if len(changes) > 1:
            raise ServiceError(
                "deployment.one_change",
                "Change 'team' alone: hand the deployment over, then scale or roll out.",
                {"fields": sorted(str(name) for name in changes)},
            )
        team_id = changes["team"]
        if not isinstance(team_id, int) or isinstance(team_id, bool):
            raise ServiceError(
                "team.not_found", f"Team {team_id!r} does not exist.", {"team": str(team_id)}
            )
        return deployment_set_team(
            deployment_id=deployment_id, team_id=team_id, requested_by=requested_by
        )
    if "workload" in changes:
        if "replicas" in changes:
            raise ServiceError(
                "deployment.one_change",
                "Change 'replicas' or 'workload', not both at once: scale, then roll out.",
                {"fields": ["replicas", "workload"]},
            )
        settings = changes.get("rollout") or {}
        if not isinstance(settings, Mapping) or set(settings) - ROLLOUT_FIELDS:
            raise ServiceError(
                "rollout.invalid",
                f"'rollout' takes {', '.join(sorted(ROLLOUT_FIELDS))}.",
                {"fields": sorted(ROLLOUT_FIELDS)},
            )
        return deployment_rollout_start(
            deployment_id=deployment_id,
            workload=changes["workload"],
            max_surge=settings.get("max_surge", 1),
            max_unavailable=settings.get("max_unavailable", 0),
            timeout_s=_timeout(settings.get("timeout_s")),
            min_ready_s=settings.get("min_ready_s"),
            requested_by=requested_by,
        )
    if "rollout" in changes:
        raise ServiceError(
            "rollout.invalid", "'rollout' goes with a new 'workload'.", {"field": "rollout"}
        )
    if "replicas" not in changes:
        raise ServiceError(
            "deployment.replicas_required",
            "Nothing to change: give 'replicas' or 'workload'.",
            {"field": "replicas"},
        )
    return deployment_scale(
        deployment_id=deployment_id, replicas=changes["replicas"], requested_by=requested_by
    )


def _timeout(raw: Any) -> float | None:
    if raw is None:
        return None
    if not isinstance(raw, int | float) or isinstance(raw, bool) or not 10 <= raw <= 3600:
        raise ServiceError(
            "rollout.invalid",
            "'timeout_s' must be from 10 to 3600 seconds.",
            {"field": "timeout_s", "min": 10, "max": 3600},
        )
    return float(raw)


def _check_fields(changes: Mapping[str, Any]) -> None:
    fixed = sorted(str(name) for name in changes if name in FIXED_FIELDS | READ_ONLY_FIELDS)
    if fixed:
        raise ServiceError(
            "deployment.field_immutable",
            f"{', '.join(fixed)} cannot be changed after creation; only 'replicas', "
            "'workload' and 'team' can. Create a new deployment for another request.",
            {"fields": fixed},
        )
    unknown = sorted(str(name) for name in changes if name not in CHANGEABLE)
    if unknown:
        raise ServiceError(
            "deployment.field_unknown",
            f"Unknown field(s): {', '.join(unknown)}. Only 'replicas', 'workload' (with "
            "'rollout') and 'team' can be changed.",
            {"fields": unknown},
        )


def _checked_replicas(replicas: Any) -> int:
    if (
        not isinstance(replicas, int)
        or isinstance(replicas, bool)
        or not MIN_REPLICAS <= replicas <= MAX_REPLICAS
    ):
        raise ServiceError(
            "deployment.replicas_invalid",
            f"'replicas' must be a whole number from {MIN_REPLICAS} to {MAX_REPLICAS}.",
            {"field": "replicas", "min": MIN_REPLICAS, "max": MAX_REPLICAS},
        )
    return replicas


@transaction.atomic
def deployment_scale(
    *, deployment_id: int, replicas: Any, requested_by: Any = None
) -> Operation | None:
    """Set the deployment's replica count; see the module's docstring for what moves.

    Raises ``deployment.not_found`` (404), ``deployment.deleting`` (409), and, for an
    auto-placed deployment without room for every new replica, the placement engine's refusal
    (422); in every case nothing changed. Returns the ``scale`` operation, or ``None`` when the
    count is already ``replicas``.
    """
    wanted = _checked_replicas(replicas)
    deployment = lock_deployment(deployment_id)
    before = deployment.replicas
    if wanted == before:
        return None
    Deployment.objects.filter(pk=deployment.pk).update(replicas=wanted, updated_at=timezone.now())
    deployment.replicas = wanted
    payload: dict[str, Any] = {"from": before, "to": wanted}
    if wanted < before:
        payload.update(_scale_down(deployment, wanted, requested_by))
    elif deployment.auto_place:
        placed = deployment_autoplace(deployment_id=deployment.pk, requested_by=requested_by)
        payload["placed"] = [operation.pk for operation in placed]
    return operation_record(
        kind=OperationKind.SCALE,
        summary=f"Scaled {deployment.name} from {before} to {wanted} replicas",
        requested_by=requested_by,
        deployment=deployment,
        status=OperationStatus.SUCCEEDED,
        payload=payload,
    )


def _scale_down(deployment: Deployment, wanted: int, requested_by: Any) -> dict[str, Any]:
    """Evict the replicas at index ``wanted`` and above (the newest), under the host locks."""
    surplus = deployment.allocations.placed().filter(replica__gte=wanted)
    stopped = sorted(set(surplus.values_list("replica", flat=True)), reverse=True)
    evicted = (
        allocations_evict(deployment=deployment, allocations=surplus, requested_by=requested_by)
        if stopped
        else []
    )
    return {"stopped_replicas": stopped, "evicted": [operation.pk for operation in evicted]}
