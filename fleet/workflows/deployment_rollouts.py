"""The rolling update workflow: a deployment's new workload reaches its replicas a few at a
time, once :func:`fleet.allocations.deployment_rollouts.deployment_rollout_start` saved it.

Each replica gets a new copy running the new version on the engine's best target (a move, make
before break), at most ``max_surge`` at once; its old copy stops only once the new one runs. A
replica whose surge copy has nowhere to go is stopped, then placed again once its slice is free,
when ``max_unavailable`` allows it, and otherwise fails the rollout. A new copy counts as
updated once it has stayed running for ``min_ready_s`` (Kubernetes' ``minReadySeconds``), and
fails the rollout when it is not ready for that long within ``timeout_s`` of its move
(``progressDeadlineSeconds``).

Its compensation is the rollback, steps of its own: the deployment gets its previous workload
back and the replicas already updated go back to it the same way, make before break. The engine
(:mod:`fleet.workflows.engine`) advances it after each workload report, and from beat.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.deployment_rollouts import RolloutStep
from fleet.allocations.models import (
    FAILED_STATES,
    Allocation,
    AllocationState,
    Deployment,
    WorkloadState,
)
from fleet.allocations.moves import allocation_move_anywhere
from fleet.allocations.quotas import QuotaExceeded
from fleet.allocations.services import deployment_evict
from fleet.allocations.workloads import runtime_of
from fleet.core.errors import ServiceError
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import RUNNING
from fleet.core.secrets import secret_decrypt
from fleet.inventory.models import HostStatus
from fleet.workflows.engine import WAIT, Outcome, Run, Workflow, deadline_of, workflow_run

logger = logging.getLogger(__name__)


class DeploymentRollout(Workflow):
    kind = OperationKind.DEPLOYMENT_ROLLOUT
    steps = {
        RolloutStep.ROLLING: "Rolling out the new workload",
        RolloutStep.ROLLING_BACK: "Rolling back to the previous workload",
        RolloutStep.DONE: "Done",
        RolloutStep.FAILED: "Failed",
    }

    def advance(self, run: Run) -> Outcome:
        operation = run.operation
        # A deployment deleted mid-rollout leaves the operation with no deployment (SET_NULL):
        # the rollout ends there, and never stops the others' advance (nor the moves').
        found = _deployment(operation)
        if found is None:
            return run.fail("the deployment was deleted")
        _collect(found, run.payload)
        _start(found, run, run.payload)
        return _settle(found, run)

    def deadline(self, run: Run) -> datetime | None:
        # Each new copy has its own (timeout_s); a rollback waits for its moves.
        if run.payload.get("step") == RolloutStep.ROLLING_BACK:
            return None
        return deadline_of(run.payload)

    def compensate(self, run: Run, reason: str) -> str | None:
        payload = run.payload
        deployment = _deployment(run.operation)
        rolling = payload.get("step") == RolloutStep.ROLLING
        if rolling and deployment is not None and payload.get("failure") is None:
            payload["failure"] = reason  # the previous workload back, step by step
            _roll_back(deployment, payload)
            return None
        payload.pop("sealed_previous", None)  # no rollback from now on: not kept
        return reason


WORKFLOW = DeploymentRollout()


def deployment_rollout_advance(*, operation_id: int) -> str:
    """Move the rollout on as far as it can go now: ``wait``, ``done`` or ``failed``."""
    return workflow_run(WORKFLOW, operation_id)


def _deployment(operation: Operation) -> Deployment | None:
    if operation.deployment_id is None:
        return None
    found = Deployment.objects.select_for_update().filter(pk=operation.deployment_id).first()
    return None if found is None or found.deleting else found


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


def _start(deployment: Deployment, run: Run, payload: dict[str, Any]) -> None:
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
        why = f"rolling update (operation {run.operation.pk})"
        try:
            with transaction.atomic():
                move = allocation_move_anywhere(
                    allocation_id=current.pk,
                    workload=spec,
                    timeout_s=payload["timeout_s"],
                    off_its_gpu=False,
                    reason=why,
                    requested_by=run.operation.requested_by,
                )
            run.adopt(move)
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
        freeing = Allocation.objects.filter(state=AllocationState.RELEASING).exclude(
            gpu__host__status=HostStatus.OFFLINE  # a silent host frees nothing soon
        )
        if freeing.exists():
            # Copies stopping (draining, then their stop grace) free their slices soon: wait
            # for them (the reports that free them wake this; the deadline bounds it).
            payload["pending"].insert(0, replica)
            _wait_note(payload, f"{no_room} Slices are being released: trying again then.")
            break
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


def _settle(deployment: Deployment, run: Run) -> Outcome:
    payload = run.payload
    if payload["pending"] or payload["moving"]:
        return WAIT
    if payload["step"] == RolloutStep.ROLLING:
        payload.pop("sealed_previous", None)  # no rollback from now on: not kept
        return run.succeed(
            f"{len(payload['updated'])} replica(s) of {deployment.name} run the new workload"
        )
    problems = "; ".join(payload["problems"])
    return run.fail(
        f"{payload['failure']}; the rollout stopped and {len(payload['rolled_back'])} updated "
        "replica(s) went back to the previous workload"
        + (f" (not all: {problems})" if problems else "")
    )
