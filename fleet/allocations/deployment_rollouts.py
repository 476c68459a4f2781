"""Rolling updates: a deployment's new workload reaches its replicas a few at a time.

Each replica gets a new copy running the new version on the engine's best target (a move, make
before break: :mod:`fleet.allocations.moves`), at most ``max_surge`` at once; its old copy stops
only once the new one runs. A replica whose surge copy has nowhere to go is stopped, then placed
again once its slice is free, when ``max_unavailable`` allows it (at most that many down at
once), and otherwise fails the rollout. A new copy that fails (its start, its health check, its
deadline) stops the rollout: the deployment gets its previous workload back and the replicas
already updated roll back the same way, make before break; the operation says why.

As Kubernetes' ``minReadySeconds``: a new copy counts as updated only once it has stayed running
(no restart, no exit) for ``min_ready_s`` after its move; a version that starts and then crashes
fails the rollout. As ``progressDeadlineSeconds``: a copy that is not ready for that long within
``timeout_s`` of its move fails it too.

One ``rollout`` operation carries it all in its ``payload``: this module starts it
(:func:`deployment_rollout_start`), and the rolling update workflow
(:mod:`fleet.workflows.deployment_rollouts`) moves it on. The payload is part of
the audit trail that every viewer reads, forever: its ``previous`` and ``workload`` show each env
value as a digest (:func:`fleet.core.secrets.workload_digested`), and the previous workload a
rollback needs is kept encrypted (``sealed_previous``) and only until the rollout ends.
"""

from __future__ import annotations

import json
import logging
from enum import StrEnum
from typing import Any, NotRequired

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.allocations.models import Deployment
from fleet.allocations.services import lock_deployment
from fleet.allocations.workloads import workload_from_input, workload_of
from fleet.core.errors import ServiceError
from fleet.core.events import publish_changed
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import (
    WorkflowPayload,
    operation_record,
    operation_refuse_running,
)
from fleet.core.policy import effective_policy, image_allowed, policy_enforce
from fleet.core.registry import PIN_KEY, pin_of, workload_pinned
from fleet.core.secrets import (
    secret_encrypt,
    secrets_enforce,
    workload_digested,
)
from hostagent import protocol

logger = logging.getLogger(__name__)

MAX_SURGE = 10


class RolloutStep(StrEnum):
    """Where a rollout is (``payload["step"]``)."""

    ROLLING = "rolling"
    ROLLING_BACK = "rolling_back"
    DONE = "done"
    FAILED = "failed"


class RolloutPayload(WorkflowPayload):
    """A rolling update's payload (fleet.workflows.deployment_rollouts advances it)."""

    previous: Any
    workload: Any
    sealed_previous: NotRequired[str]
    max_surge: int
    max_unavailable: int
    timeout_s: float
    min_ready_s: int
    pending: list[int]
    moving: dict[str, dict[str, Any]]
    updated: list[int]
    rolled_back: list[int]
    failure: str | None
    problems: list[str]


def _timeout_s() -> float:
    return float(getattr(settings, "FLEET_MOVE_TIMEOUT_SECONDS", 300.0))


MAX_MIN_READY_S = 3600


def _min_ready_s() -> int:
    return int(getattr(settings, "FLEET_ROLLOUT_MIN_READY_SECONDS", 10))


def _bounded(name: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ServiceError(
            "rollout.invalid",
            f"'{name}' must be a whole number from {low} to {high}.",
            {"field": name, "min": low, "max": high},
        )
    return value


def _pinned(deployment_id: int, checked: protocol.Workload) -> dict[str, Any]:
    """The workload to store, its image pinned when its team's policy lets the image in (read
    without a lock: the registry may take seconds; the policy is enforced again once locked)."""
    found = Deployment.objects.select_related("team").filter(pk=deployment_id).first()
    allowed = found is not None and (
        checked["runtime"] != "container"
        or image_allowed(checked["image"] or "", effective_policy(found.team.policy)["registries"])
    )
    return workload_pinned(checked, allowed=allowed, now=timezone.now())


def _pin_entry(stored: Any, workload: protocol.Workload) -> dict[str, Any]:
    """``{"image_pin": …}`` of the stored workload, when it pins ``workload``'s image."""
    container = workload["runtime"] == "container"
    pin = pin_of(stored, workload["image"] or "") if container else None
    return {PIN_KEY: pin} if pin is not None else {}


@transaction.atomic
def deployment_rollout_start(
    *,
    deployment_id: int,
    workload: Any,
    max_surge: int = 1,
    max_unavailable: int = 0,
    timeout_s: float | None = None,
    min_ready_s: int | None = None,
    restart: bool = False,
    requested_by: Any = None,
) -> Operation:
    """Start rolling the deployment's replicas to ``workload``; returns the ``rollout``
    operation (already succeeded when nothing runs that must change). ``restart``: roll even
    when the workload is the one they run (a secret it refers to has a new value: each new
    copy starts with it). A container's image is pinned again (the registry's digest now),
    before the deployment is locked."""
    checked = workload_from_input(workload)
    stored = _pinned(deployment_id, checked)
    surge = _bounded("max_surge", max_surge, 1, MAX_SURGE)
    unavailable = _bounded("max_unavailable", max_unavailable, 0, MAX_SURGE)
    min_ready = _bounded(
        "min_ready_s", _min_ready_s() if min_ready_s is None else min_ready_s, 0, MAX_MIN_READY_S
    )
    deployment = lock_deployment(deployment_id)
    policy_enforce(
        team=deployment.team, workload=checked, host_memory_mib=deployment.host_memory_mib
    )
    secrets_enforce(team=deployment.team, workload=checked)
    operation_refuse_running(
        OperationKind.DEPLOYMENT_ROLLOUT,
        "rollout.in_progress",
        f"{deployment.name} is already rolling out (operation {{operation}}); wait for it.",
        deployment=deployment,
    )
    previous = workload_of(deployment)
    if checked == previous and not restart:
        return operation_record(
            kind=OperationKind.DEPLOYMENT_ROLLOUT,
            summary=f"Rolling update of {deployment.name}: nothing to change",
            requested_by=requested_by,
            deployment=deployment,
            status=OperationStatus.SUCCEEDED,
            reason="the replicas already run this workload",
            payload={"step": RolloutStep.DONE, "workload": workload_digested(checked)},
        )
    sealed = {**previous, **_pin_entry(deployment.workload, previous)}  # the rollback's, pinned
    Deployment.objects.filter(pk=deployment.pk).update(workload=stored, updated_at=timezone.now())
    copies = deployment.allocations.placed().filter(replaces__isnull=True)
    replicas = sorted(set(copies.values_list("replica", flat=True)))
    now = timezone.now()
    operation = operation_record(
        kind=OperationKind.DEPLOYMENT_ROLLOUT,
        summary=f"Rolling update of {deployment.name}: {len(replicas)} replica(s)",
        requested_by=requested_by,
        deployment=deployment,
        status=OperationStatus.DISPATCHED,
        payload=RolloutPayload(
            step=RolloutStep.ROLLING,
            log=[{"step": "start", "note": "new workload saved", "at": now.isoformat()}],
            previous=workload_digested(previous),
            workload=workload_digested(checked),
            sealed_previous=secret_encrypt(json.dumps(sealed)),
            max_surge=surge,
            max_unavailable=unavailable,
            timeout_s=float(timeout_s if timeout_s is not None else _timeout_s()),
            min_ready_s=min_ready,
            pending=replicas,
            moving={},
            updated=[],
            rolled_back=[],
            failure=None,
            problems=[],
        ),
    )
    publish_changed("deployment", [deployment.pk])
    advance_after_commit(operation.pk)
    return operation
