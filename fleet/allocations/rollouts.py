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

One ``rollout`` operation carries it all in its ``payload``; :func:`rollout_advance` moves it on
and is safe to call any time (after each workload report, and from beat). The payload is part of
the audit trail that every viewer reads, forever: its ``previous`` and ``workload`` show each env
value as a digest (:func:`fleet.core.secrets.workload_digested`), and the previous workload a
rollback needs is kept encrypted (``sealed_previous``) and only until the rollout ends.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.models import Allocation, Deployment, WorkloadState
from fleet.allocations.moves import allocation_move_anywhere
from fleet.allocations.quotas import QuotaExceeded
from fleet.allocations.services import deployment_evict, lock_deployment
from fleet.allocations.workloads import runtime_of, workload_from_input, workload_of
from fleet.core.errors import Conflict, ServiceError
from fleet.core.events import publish_changed
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import (
    RUNNING,
    operation_finish,
    operation_lock_running,
    operation_record,
)
from fleet.core.policy import effective_policy, image_allowed, policy_enforce
from fleet.core.registry import PIN_KEY, pin_of, workload_pinned
from fleet.core.secrets import (
    secret_decrypt,
    secret_encrypt,
    secrets_enforce,
    workload_digested,
)
from hostagent import protocol

logger = logging.getLogger(__name__)

MAX_SURGE = 10
FAILED_STATES = frozenset({WorkloadState.FAILED, WorkloadState.CRASHLOOP, WorkloadState.EXITED})


class RolloutStep(StrEnum):
    """Where a rollout is (``payload["step"]``)."""

    ROLLING = "rolling"
    ROLLING_BACK = "rolling_back"
    DONE = "done"
    FAILED = "failed"


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
def deployment_roll(
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
    running = Operation.objects.filter(
        kind=OperationKind.ROLLOUT, deployment=deployment, status__in=RUNNING
    ).first()
    if running is not None:
        raise Conflict(
            "rollout.in_progress",
            f"{deployment.name} is already rolling out (operation {running.pk}); wait for it.",
            {"operation": running.pk},
        )
    previous = workload_of(deployment)
    if checked == previous and not restart:
        return operation_record(
            kind=OperationKind.ROLLOUT,
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
        kind=OperationKind.ROLLOUT,
        summary=f"Rolling update of {deployment.name}: {len(replicas)} replica(s)",
        requested_by=requested_by,
        deployment=deployment,
        status=OperationStatus.DISPATCHED,
        payload={
            "step": RolloutStep.ROLLING,
            "log": [{"step": "start", "note": "new workload saved", "at": now.isoformat()}],
            "previous": workload_digested(previous),
            "workload": workload_digested(checked),
            "sealed_previous": secret_encrypt(json.dumps(sealed)),
            "max_surge": surge,
            "max_unavailable": unavailable,
            "timeout_s": float(timeout_s if timeout_s is not None else _timeout_s()),
            "min_ready_s": min_ready,
            "pending": replicas,
            "moving": {},
            "updated": [],
            "rolled_back": [],
            "failure": None,
            "problems": [],
        },
    )
    publish_changed("deployment", [deployment.pk])
    advance_after_commit(operation.pk)
    return operation


def rollout_advance(*, operation_id: int) -> str:
    """Move the rollout on as far as it can go now; returns the step it is at."""
    with transaction.atomic():
        operation = operation_lock_running(operation_id, OperationKind.ROLLOUT)
        if operation is None:
            return RolloutStep.DONE
        # A deployment deleted mid-rollout leaves the operation with no deployment (SET_NULL):
        # the rollout ends there, and never stops the others' advance (nor the moves').
        found = (
            None
            if operation.deployment_id is None
            else Deployment.objects.select_for_update().filter(pk=operation.deployment_id).first()
        )
        if found is None or found.deleting:
            _finish(operation, OperationStatus.FAILED, "the deployment was deleted")
            return RolloutStep.FAILED
        payload = dict(operation.payload)
        _collect(found, payload)
        _start(found, operation, payload)
        return _settle(found, operation, payload)


def _collect(deployment: Deployment, payload: dict[str, Any]) -> None:
    """Take in the replicas whose new copy finished: updated, or the rollout's failure."""
    for key, entry in list(payload["moving"].items()):
        replica, mode = int(key), entry["mode"]
        outcome = _outcome(deployment, entry, payload["timeout_s"])
        switched = outcome is not None and outcome[0] and mode == RolloutStep.ROLLING
        if switched:  # its old copy is gone: on probation (min_ready_s) in the new version
            outcome = _stayed_ready(deployment, entry, payload)
        if outcome is None:
            continue
        del payload["moving"][key]
        ok, why = outcome
        if switched and not ok:  # it runs the new version: the rollback takes it back too
            payload["updated"].append(replica)
        if ok:
            if mode == RolloutStep.ROLLING:
                payload["updated"].append(replica)
                if payload["step"] == RolloutStep.ROLLING_BACK:
                    payload["pending"].append(replica)  # finished after the failure: back too
            else:
                payload["rolled_back"].append(replica)
        elif mode == RolloutStep.ROLLING and payload["failure"] is None:
            payload["failure"] = f"replica {replica}: {why}"
        else:
            payload["problems"].append(f"replica {replica}: {why}")
    if payload["failure"] is not None and payload["step"] == RolloutStep.ROLLING:
        _roll_back(deployment, payload)


def _outcome(
    deployment: Deployment, entry: dict[str, Any], timeout_s: float
) -> tuple[bool, str] | None:
    """``None`` while the replica's new copy is on its way; else (succeeded, why not)."""
    if entry.get("move") is not None:
        move = Operation.objects.filter(pk=entry["move"]).first()
        if move is None or move.status in RUNNING:
            return None
        return move.status == OperationStatus.SUCCEEDED, move.reason or move.status
    # Stopped, then placed again once its slice is free (the old workload has exited).
    started = parse_datetime(entry["started"])
    late = started is not None and timezone.now() > started + timedelta(seconds=timeout_s)
    if entry.get("allocation") is None:
        if Allocation.objects.filter(pk=entry["stopped"]).exists():
            return (False, f"its old copy did not stop within {int(timeout_s)} s") if late else None
        placed = _place_again(deployment, int(entry["replica"]))
        if placed is None:
            return False, "it fits nowhere after it stopped"
        entry["allocation"] = placed
    copy = Allocation.objects.placed().filter(pk=entry["allocation"]).first()
    if copy is None:
        return False, "its new copy was evicted"
    if copy.workload_state == WorkloadState.RUNNING or runtime_of(deployment, copy) == "none":
        return True, ""
    if copy.workload_state in FAILED_STATES:
        detail = f": {copy.workload_message}" if copy.workload_message else ""
        return False, f"the new copy {copy.workload_state}{detail}"
    if late:
        return False, f"the new copy was not running within {int(timeout_s)} s"
    return None


def _stayed_ready(
    deployment: Deployment, entry: dict[str, Any], payload: dict[str, Any]
) -> tuple[bool, str] | None:
    """A new copy that is running counts once it has stayed so for ``min_ready_s`` (no restart,
    no exit): ``None`` while it is on probation; a failure when it exited, restarted or was not
    ready again by ``timeout_s`` after it first ran."""
    min_ready = float(payload.get("min_ready_s", 0))
    if min_ready <= 0:
        return True, ""
    copy_id = entry.get("allocation")
    if copy_id is None and entry.get("move") is not None:
        move = Operation.objects.filter(pk=entry["move"]).values_list("payload", flat=True).first()
        copy_id = (move or {}).get("to_allocation")
        entry["allocation"] = copy_id
    copy = Allocation.objects.placed().filter(pk=copy_id).first() if copy_id else None
    if copy is None:
        return False, "its new copy was evicted"
    if runtime_of(deployment, copy) == "none":
        return True, ""
    now = timezone.now()
    first = entry.setdefault("ran_at", now.isoformat())
    restarts = entry.setdefault("restarts", copy.restarts)
    if copy.workload_state in FAILED_STATES:
        detail = f": {copy.workload_message}" if copy.workload_message else ""
        return False, f"the new copy {copy.workload_state} after it started{detail}"
    if copy.workload_state != WorkloadState.RUNNING or copy.restarts != restarts:
        entry["restarts"] = copy.restarts
        entry.pop("ready_since", None)  # not ready: its probation starts again
    else:
        since = parse_datetime(entry.setdefault("ready_since", now.isoformat()))
        if since is not None and (now - since).total_seconds() >= min_ready:
            return True, ""
    started = parse_datetime(first)
    if started is not None and (now - started).total_seconds() > payload["timeout_s"]:
        return False, (
            f"the new copy did not stay running for {int(min_ready)} s within "
            f"{int(payload['timeout_s'])} s ({copy.workload_state}, {copy.restarts} restart(s))"
        )
    return None


def _sealed_previous(payload: dict[str, Any]) -> Any:
    """The workload before the rollout, decrypted; ``None`` when no key opens it any more. A
    rollout started before workloads were sealed keeps it in ``previous`` as it was."""
    sealed = payload.get("sealed_previous")
    if sealed is None:
        return payload["previous"]
    opened = secret_decrypt(sealed)
    return json.loads(opened) if opened is not None else None


def _roll_back(deployment: Deployment, payload: dict[str, Any]) -> None:
    """The new version failed: the deployment gets the previous one back, and every replica
    already updated goes back to it."""
    previous = _sealed_previous(payload)
    payload["step"] = RolloutStep.ROLLING_BACK
    note = f"{payload['failure']}; rolling back"
    if previous is None:  # FLEET_SECRETS_KEYS lost the key: stop where it is instead
        payload["pending"] = []
        note = f"{payload['failure']}; the previous workload cannot be decrypted: not rolled back"
    else:
        Deployment.objects.filter(pk=deployment.pk).update(
            workload=previous, updated_at=timezone.now()
        )
        deployment.workload = previous
        payload["pending"] = list(payload["updated"])
    payload["log"].append(
        {"step": RolloutStep.ROLLING, "note": note, "at": timezone.now().isoformat()}
    )


def _start(deployment: Deployment, operation: Operation, payload: dict[str, Any]) -> None:
    """New copies for the next replicas, up to ``max_surge`` on their way at once."""
    mode = payload["step"]
    # The deployment holds the new workload while rolling, the previous one once rolling back.
    spec = dict(deployment.workload)
    down = sum(1 for e in payload["moving"].values() if e.get("move") is None)
    while payload["pending"] and len(payload["moving"]) < payload["max_surge"]:
        replica = int(payload["pending"].pop(0))
        copies = deployment.allocations.placed().filter(replica=replica)
        current = copies.filter(replaces__isnull=True).order_by("gpu_slot").first()
        if current is None:
            continue  # scaled down or evicted meanwhile: nothing to update
        if copies.filter(replaces__isnull=False).exists():
            payload["pending"].append(replica)  # an operator's move is on its way: later
            break
        if runtime_of(deployment, current) == "none" and spec["runtime"] == "none":
            Allocation.objects.filter(pk=current.pk).update(workload=spec)  # nothing runs
            payload["updated" if mode == RolloutStep.ROLLING else "rolled_back"].append(replica)
            continue
        why = f"rolling update (operation {operation.pk})"
        try:
            with transaction.atomic():
                move = allocation_move_anywhere(
                    allocation_id=current.pk,
                    workload=spec,
                    timeout_s=payload["timeout_s"],
                    off_its_gpu=False,
                    reason=why,
                    requested_by=operation.requested_by,
                )
            payload["moving"][str(replica)] = {"mode": mode, "move": move.pk}
            continue
        except QuotaExceeded as error:
            if down >= payload["max_unavailable"]:
                # The team's one surge replica is in use and its quota cannot count another
                # new copy: wait for a move to end, as for an operator's move (they all do).
                payload["pending"].insert(0, replica)
                _wait_note(payload, error.message)
                break
            no_room = error.message
        except ServiceError as error:
            no_room = error.message
        if down < payload["max_unavailable"]:
            with transaction.atomic():
                deployment_evict(deployment_id=deployment.pk, replica=replica)
            payload["moving"][str(replica)] = {
                "mode": mode,
                "move": None,
                "replica": replica,
                "stopped": current.pk,
                "allocation": None,
                "started": timezone.now().isoformat(),
            }
            down += 1
            continue
        problem = f"no room for a new copy of replica {replica}: {no_room}"
        if mode == RolloutStep.ROLLING:
            payload["failure"] = problem
            _roll_back(deployment, payload)
            return
        payload["problems"].append(problem)


def _wait_note(payload: dict[str, Any], why: str) -> None:
    """Say once (not at every advance) why the next new copy waits."""
    note = f"waiting: {why}"
    if payload.get("waiting_for") != note:
        payload["waiting_for"] = note
        payload["log"].append(
            {"step": payload["step"], "note": note, "at": timezone.now().isoformat()}
        )


def _place_again(deployment: Deployment, replica: int) -> int | None:
    """A stopped replica's new copy (it runs the deployment's workload now), or ``None`` when
    it fits nowhere."""
    try:
        with transaction.atomic():
            placed = deployment_autoplace(deployment_id=deployment.pk, limit=1)
    except ServiceError as error:
        logger.info("rollout of %s: replica %s fits nowhere: %s", deployment, replica, error)
        return None
    if not placed:
        return None
    return (
        Allocation.objects.placed()
        .filter(deployment=deployment, replica=replica)
        .order_by("-pk")
        .values_list("pk", flat=True)
        .first()
    )


def _settle(deployment: Deployment, operation: Operation, payload: dict[str, Any]) -> str:
    if payload["pending"] or payload["moving"]:
        operation.payload = payload
        operation.save(update_fields=["payload", "updated_at"])
        publish_changed("operation", [operation.pk])
        return str(payload["step"])
    if payload["step"] == RolloutStep.ROLLING:
        operation.payload = payload
        _finish(
            operation,
            OperationStatus.SUCCEEDED,
            f"{len(payload['updated'])} replica(s) of {deployment.name} run the new workload",
        )
        return RolloutStep.DONE
    problems = "; ".join(payload["problems"])
    operation.payload = payload
    _finish(
        operation,
        OperationStatus.FAILED,
        f"{payload['failure']}; the rollout stopped and {len(payload['rolled_back'])} updated "
        "replica(s) went back to the previous workload"
        + (f" (not all: {problems})" if problems else ""),
    )
    return RolloutStep.FAILED


def _finish(operation: Operation, status: str, reason: str) -> None:
    if "sealed_previous" in operation.payload:  # no rollback from now on: not kept
        operation.payload = {k: v for k, v in operation.payload.items() if k != "sealed_previous"}
    operation_finish(operation, status, reason, done=RolloutStep.DONE, failed=RolloutStep.FAILED)
    if operation.deployment_id is not None:
        publish_changed("deployment", [operation.deployment_id])


def rollouts_advance() -> list[str]:
    """Advance every running rollout: after workload reports, and from beat."""
    running = Operation.objects.filter(kind=OperationKind.ROLLOUT, status__in=RUNNING)
    return [rollout_advance(operation_id=pk) for pk in running.values_list("pk", flat=True)]
