"""The host drain workflow: a whole host emptied, once
:func:`fleet.allocations.maintenance.host_drain` recorded it. A drain ``at`` a later time waits
(step ``scheduled``) until then. Then the host is ``draining`` and its replicas move off one at
a time, make before break (:func:`fleet.allocations.moves.allocation_move_anywhere`); a replica
with nowhere to go is reported (``payload["stuck"]``) and tried again at most every few seconds
until the deadline, or stopped when the drain was asked with ``force``. Once nothing is left the
host is in ``maintenance``.

Its compensation: the host stays out of placement (cordoned) with what it still runs; the
replicas that moved stay where they went. The engine (:mod:`fleet.workflows.engine`) advances it
after each workload report (a move it waits for may have ended) and from beat (the schedule,
deadlines).
"""

from __future__ import annotations

import copy
from datetime import timedelta

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.allocations.maintenance import (
    DRAINABLE,
    RETRY_STUCK_S,
    HostDrainStep,
    host_drain_begin,
    lock_host,
)
from fleet.allocations.models import Allocation
from fleet.allocations.moves import allocation_move_anywhere
from fleet.allocations.services import deployment_evict
from fleet.core.errors import ServiceError
from fleet.core.events import publish_changed
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import RUNNING
from fleet.inventory.models import Host, HostStatus
from fleet.workflows.engine import WAIT, Outcome, Run, Workflow, workflow_run


class HostDrain(Workflow):
    kind = OperationKind.DRAIN_HOST
    steps = {
        HostDrainStep.SCHEDULED: "Scheduled",
        HostDrainStep.MOVE: "Moving replicas off the host",
        HostDrainStep.WAIT_EMPTY: "Waiting until the host is empty",
        HostDrainStep.DONE: "In maintenance",
        HostDrainStep.FAILED: "Failed",
    }

    def advance(self, run: Run) -> Outcome:
        operation = run.operation
        assert operation.host_id is not None
        now = timezone.now()
        if run.payload["step"] == HostDrainStep.SCHEDULED:
            at = parse_datetime(run.payload["at"])
            if at is not None and now < at:
                return WAIT
            host = lock_host(operation.host_id)
            if host.status not in DRAINABLE:
                return run.fail(
                    f"{host} was {host.status} at the scheduled time; nothing was moved"
                )
            host_drain_begin(operation, host, now)
            run.payload = copy.deepcopy(operation.payload)
        host = Host.objects.get(pk=operation.host_id)
        if run.payload["step"] == HostDrainStep.MOVE:
            if waiting := _move_next(run, host):
                return _waiting(run, waiting)
            run.note(_moved_note(run), step=HostDrainStep.WAIT_EMPTY)
        if stopping := Allocation.objects.filter(gpu__host=host).count():
            return _waiting(run, f"{stopping} workload(s) on {host} still stopping")
        Host.objects.filter(pk=host.pk, status=HostStatus.DRAINING).update(
            status=HostStatus.MAINTENANCE, updated_at=now
        )
        publish_changed("host", [host.pk])
        return run.succeed(
            f"{host} is empty and in maintenance; uncordon it to return it to service"
        )

    def timeout_reason(self, run: Run) -> str:
        return f"stuck for {int(run.payload['timeout_s'])} s: {run.payload.get('waiting_for')}"

    def compensate(self, run: Run, reason: str) -> str:
        if run.payload.get("step") == HostDrainStep.SCHEDULED:
            return reason  # it never started: nothing to undo
        host_id = run.operation.host_id
        assert host_id is not None  # a host drain is of one host
        Host.objects.filter(pk=host_id, status=HostStatus.DRAINING).update(
            status=HostStatus.CORDONED, updated_at=timezone.now()
        )
        publish_changed("host", [host_id])
        return f"{reason}; the host stays cordoned"


WORKFLOW = HostDrain()


def host_drain_advance(*, operation_id: int) -> str:
    """Move the host drain forward as far as it can go now: ``wait``, ``done`` or ``failed``."""
    return workflow_run(WORKFLOW, operation_id)


def _move_next(run: Run, host: Host) -> str:
    """Start the next move (one at a time); returns what the drain waits for, or "" when every
    replica is off the host (or stopped)."""
    payload = run.payload
    current = payload.get("current_move")
    if current is not None:
        move = Operation.objects.get(pk=current)
        if move.status in RUNNING:
            return f"{move.summary}: waiting for the new copy to run"
        failed = dict(payload.get("failed", {}))
        if move.status != OperationStatus.SUCCEEDED:
            failed[str(move.payload.get("from_allocation"))] = move.reason
        payload.update(current_move=None, failed=failed)
    elif _tried_lately(run):
        # Replicas with nowhere to go are ranked again at most every RETRY_STUCK_S: every
        # workload report of the fleet advances the drain, and each try ranks the fleet.
        return str(payload.get("waiting_for") or "replicas with nowhere to go")
    stuck: dict[str, str] = {}
    payload["tried_at"] = timezone.now().isoformat()
    for allocation in _to_move(host):
        key = str(allocation.pk)
        name = f"{allocation.deployment.name}[{allocation.replica}]"
        if key in payload.get("failed", {}):
            stuck[key] = f"{name}: its move failed ({payload['failed'][key]})"
            continue
        try:
            with transaction.atomic():
                why = f"draining host {host} (operation {run.operation.pk})"
                move = allocation_move_anywhere(
                    allocation_id=allocation.pk, reason=why, over_quota_reason=why
                )
        except ServiceError as error:
            if payload.get("force"):
                _stop(run, allocation, error.message)
                continue
            stuck[key] = f"{name}: {error.message}"
            continue
        run.adopt(move)
        payload["moves"] = [*payload.get("moves", []), move.pk]
        if move.status in RUNNING:
            run.note(f"moving {name}, make before break (operation {move.pk})")
            payload.update(current_move=move.pk, stuck=stuck)
            return f"{move.summary}: waiting for the new copy to run"
    payload["stuck"] = stuck
    moving = Allocation.objects.filter(
        gpu__host=host, replaces__isnull=True, successor__isnull=False
    ).count()
    if moving:
        return f"{moving} replica(s) moving off {host} (moves not started by this drain)"
    if stuck:
        return f"{len(stuck)} replica(s) have nowhere to go: " + "; ".join(stuck.values())
    return ""


def _tried_lately(run: Run) -> bool:
    if not run.payload.get("stuck"):
        return False
    tried = parse_datetime(str(run.payload.get("tried_at", "")))
    return tried is not None and timezone.now() - tried < timedelta(seconds=RETRY_STUCK_S)


def _to_move(host: Host) -> list[Allocation]:
    """One allocation per replica placed on the host and not moving already."""
    rows = (
        Allocation.objects.placed()
        .filter(gpu__host=host, replaces__isnull=True, successor__isnull=True)
        .select_related("deployment")
        .order_by("deployment__name", "replica", "gpu_slot")
    )
    seen: set[tuple[int, int]] = set()
    chosen = []
    for allocation in rows:
        if (allocation.deployment_id, allocation.replica) not in seen:
            seen.add((allocation.deployment_id, allocation.replica))
            chosen.append(allocation)
    return chosen


def _stop(run: Run, allocation: Allocation, why: str) -> None:
    name = f"{allocation.deployment.name}[{allocation.replica}]"
    deployment_evict(
        deployment_id=allocation.deployment_id,
        replica=allocation.replica,
        requested_by=run.operation.requested_by,
    )
    run.note(f"{name} stopped (force): {why}")
    run.payload["stopped"] = [*run.payload.get("stopped", []), name]


def _moved_note(run: Run) -> str:
    moved = len(run.payload.get("moves", []))
    stopped = len(run.payload.get("stopped", []))
    return f"{moved} replica(s) moved" + (f", {stopped} stopped (force)" if stopped else "")


def _waiting(run: Run, waiting_for: str) -> Outcome:
    if run.payload.get("waiting_for") != waiting_for:
        run.note(f"waiting: {waiting_for}")
        run.payload["waiting_for"] = waiting_for
    return WAIT
