"""The drain workflow: one GPU drained (and reshaped) once :func:`fleet.allocations.drain.gpu_drain`
recorded it. Cordon it, move its replicas make before break (each new copy runs elsewhere before
the old one stops; what cannot move that way is stopped and placed again), wait until the agent
confirms it is idle, apply the new layout, verify it, uncordon.

Its compensation: a failure after the new layout was sent rolls back to the previous layout
(a step of its own: the agent applies it), and the GPU is uncordoned unless it was cordoned
before. The engine (:mod:`fleet.workflows.engine`) advances it on commit, after every ack of
its host, when one of its moves ends on a report, and from beat.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fleet.allocations.drain import DrainStep, layout_from_payload
from fleet.allocations.models import Allocation
from fleet.allocations.moves import gpu_moves_start, moves_cancel_onto
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import RUNNING
from fleet.inventory.models import Gpu, Host
from fleet.partitioning.services import gpu_set_cordon, gpu_set_layout, layout_disturbed_partitions
from fleet.workflows.engine import WAIT, Outcome, Run, Workflow, deadline_of, workflow_run
from fleet.workflows.health import replace_allocations

# Rounds of moves before what is left is stopped and placed again: a move is cancelled when its
# target starts draining too (a rollout's next GPU), and the replica can often go elsewhere.
MOVE_ROUNDS = 3

# How the UI words each step (the editor's progress line).
DRAIN_STEP_LABELS: dict[str, str] = {
    DrainStep.CORDON: "cordoning",
    DrainStep.MOVE: "moving workloads",
    DrainStep.WAIT_MOVES: "waiting for the moved workloads to run",
    DrainStep.WAIT_IDLE: "waiting until idle",
    DrainStep.WAIT_APPLY: "applying the layout",
    DrainStep.ROLLBACK: "rolling back",
    DrainStep.DONE: "done",
    DrainStep.FAILED: "failed",
}


class Drain(Workflow):
    kind = OperationKind.DRAIN
    steps = DRAIN_STEP_LABELS

    def advance(self, run: Run) -> Outcome:
        assert run.operation.gpu_id is not None  # a drain is of one GPU
        gpu = Gpu.objects.select_related("host").get(pk=run.operation.gpu_id)
        step = run.payload["step"]
        if step == DrainStep.CORDON:
            return _cordon(run, gpu)
        if step == DrainStep.MOVE:
            _move(run, gpu)
        waiting = _wait_moves(run, gpu) if run.payload["step"] == DrainStep.WAIT_MOVES else None
        if waiting is None and run.payload["step"] == DrainStep.WAIT_IDLE:
            waiting = _wait_idle(run, gpu)
        if waiting is not None:
            return _waiting(run, waiting)
        if run.payload["step"] == DrainStep.WAIT_IDLE:
            if run.payload["layout"] is None:
                return run.succeed(f"{gpu} is drained and stays cordoned")
            reshape = gpu_set_layout(
                gpu_id=gpu.pk,
                spec=layout_from_payload(run.payload["layout"]),
                requested_by=run.operation.requested_by,
            )
            run.adopt(reshape)
            _step(
                run,
                DrainStep.WAIT_APPLY,
                "new layout sent to the agent",
                layout_operation=reshape.pk,
            )
        if run.payload["step"] == DrainStep.WAIT_APPLY:
            return _wait_apply(run, gpu)
        if run.payload["step"] == DrainStep.ROLLBACK:
            back = Operation.objects.get(pk=run.payload["rollback_operation"])
            if back.status in RUNNING:
                return WAIT
            outcome = (
                "rolled back to the previous layout"
                if back.status == OperationStatus.SUCCEEDED
                else f"rollback failed too: {back.reason}"
            )
            return run.fail(f"{run.payload['failure']}; {outcome}")
        return WAIT

    def deadline(self, run: Run) -> datetime | None:
        # A rollback under way waits for the agent as long as it takes.
        return None if run.payload.get("step") == DrainStep.ROLLBACK else deadline_of(run.payload)

    def timeout_reason(self, run: Run) -> str:
        return f"stuck for {int(run.payload['timeout_s'])} s: {run.payload.get('waiting_for')}"

    def compensate(self, run: Run, reason: str) -> str | None:
        payload = run.payload
        assert run.operation.gpu_id is not None
        gpu = Gpu.objects.get(pk=run.operation.gpu_id)
        if payload.get("layout_operation") and payload.get("step") != DrainStep.ROLLBACK:
            back = gpu_set_layout(
                gpu_id=gpu.pk, spec=layout_from_payload(payload["previous_layout"])
            )
            run.adopt(back)
            _step(run, DrainStep.ROLLBACK, f"{reason}; rolling back", failure=reason)
            payload["rollback_operation"] = back.pk
            if back.status == OperationStatus.SUCCEEDED:  # nothing to undo on the agent
                advance_after_commit(run.operation.pk)
            return None
        _uncordon(run, gpu)
        return reason


WORKFLOW = Drain()


def drain_advance(*, operation_id: int) -> str:
    """Move the drain forward as far as it can go now: ``wait``, ``done`` or ``failed``."""
    return workflow_run(WORKFLOW, operation_id)


def _cordon(run: Run, gpu: Gpu) -> Outcome:
    if not gpu.cordoned:
        gpu_set_cordon(
            gpu_id=gpu.pk, cordoned=True, reason=f"draining (operation {run.operation.pk})"
        )
    _step(run, DrainStep.MOVE, "cordoned")
    # Commit the cordon (and release the host's lock) before moving: a move locks the
    # deployment, then hosts, as placement does; holding this host across it would take the
    # locks in the opposite order and could deadlock with a concurrent place.
    advance_after_commit(run.operation.pk)
    return WAIT


def _move(run: Run, gpu: Gpu) -> None:
    why = f"draining {gpu} (operation {run.operation.pk})"
    # A reshape moves only the replicas whose partitions it destroys or re-polices, and cancels
    # only the moves arriving there.
    disturbed = _disturbed(gpu, run.payload["layout"])
    cancelled = moves_cancel_onto(gpu_id=gpu.pk, reason=f"{gpu} is draining", partitions=disturbed)
    moves, _ = gpu_moves_start(
        gpu_id=gpu.pk,
        reason=why,
        partitions=disturbed,
        avoid_gpus=run.payload.get("avoid_gpus", ()),
    )
    run.adopt_all(moves)
    kept = "" if disturbed is None else f" ({_kept_note(gpu, disturbed)})"
    _step(
        run,
        DrainStep.WAIT_MOVES,
        f"{len(moves)} replica(s) moving, make before break{kept}"
        + (f"; {len(cancelled)} move(s) onto it cancelled" if cancelled else ""),
        move_operations=moves,
        move_rounds=1,
        disturbed=None if disturbed is None else sorted(disturbed),
    )


def _wait_moves(run: Run, gpu: Gpu) -> str | None:
    """What the drain still waits for before the GPU can go idle; ``None``: nothing."""
    payload = run.payload
    moving = Operation.objects.filter(pk__in=payload["move_operations"], status__in=RUNNING)
    if count := moving.count():
        return f"{count} move(s) waiting for their new copies to run"
    rounds = int(payload.get("move_rounds", MOVE_ROUNDS))
    disturbed_ids = payload.get("disturbed")
    why = f"draining {gpu} (operation {run.operation.pk})"
    if rounds < MOVE_ROUNDS and _still_here(gpu.pk, disturbed_ids):
        moves, _ = gpu_moves_start(
            gpu_id=gpu.pk,
            reason=why,
            partitions=disturbed_ids,
            avoid_gpus=payload.get("avoid_gpus", ()),
        )
        run.adopt_all(moves)
        if moves:
            _step(
                run,
                DrainStep.WAIT_MOVES,
                f"{len(moves)} replica(s) moving again (a move failed or its target started "
                "draining)",
                move_operations=moves,
                move_rounds=rounds + 1,
            )
            return f"{len(moves)} move(s) under way"
    # What could not move that way (no target, a failed move): stopped and placed again.
    moved = replace_allocations(gpu_id=gpu.pk, reason=why, partitions=disturbed_ids)
    host = Host.objects.get(pk=gpu.host_id)
    _step(
        run,
        DrainStep.WAIT_IDLE,
        f"{len(moved)} replica(s) stopped and placed again",
        wait_generation=host.desired_generation,
        replace_operations=moved,
    )
    return None


def _wait_idle(run: Run, gpu: Gpu) -> str | None:
    host = Host.objects.get(pk=gpu.host_id)
    wanted = run.payload["wait_generation"]
    if host.applied_generation < wanted:
        return f"the agent has not confirmed {gpu} is idle (generation {wanted} not acknowledged)"
    stopping = Allocation.objects.filter(gpu_id=gpu.pk)
    if (disturbed_ids := run.payload.get("disturbed")) is not None:
        stopping = stopping.filter(partition_id__in=disturbed_ids)
    if count := stopping.count():
        return f"{count} workload(s) on {gpu} still stopping"
    return None


def _wait_apply(run: Run, gpu: Gpu) -> Outcome:
    reshape = Operation.objects.get(pk=run.payload["layout_operation"])
    if reshape.status in RUNNING:
        return _waiting(run, f"the agent has not applied the new layout of {gpu}")
    if reshape.status != OperationStatus.SUCCEEDED:
        return run.fail(f"applying the new layout failed: {reshape.reason}")
    _uncordon(run, gpu)
    return run.succeed(f"{gpu} reshaped, verified and back in service")


def _waiting(run: Run, waiting_for: str) -> Outcome:
    if run.payload.get("waiting_for") != waiting_for:
        run.note(f"waiting: {waiting_for}")
        run.payload["waiting_for"] = waiting_for
    return WAIT


def _disturbed(gpu: Gpu, layout: dict[str, Any] | None) -> set[int] | None:
    """The partitions a reshape to ``layout`` must empty; ``None``: all (a plain drain)."""
    if layout is None:
        return None
    return layout_disturbed_partitions(gpu_id=gpu.pk, spec=layout_from_payload(layout))


def _kept_note(gpu: Gpu, disturbed: set[int]) -> str:
    kept = (
        Allocation.objects.placed()
        .filter(gpu_id=gpu.pk)
        .exclude(partition_id__in=list(disturbed))
        .count()
    )
    return f"{kept} replica(s) stay: their partitions are kept" if kept else "none stays"


def _still_here(gpu_id: int, partitions: list[int] | None) -> bool:
    """Replicas still placed on what the drain empties, with no move under way."""
    left = Allocation.objects.placed().filter(
        gpu_id=gpu_id, replaces__isnull=True, successor__isnull=True
    )
    if partitions is not None:
        left = left.filter(partition_id__in=partitions)
    return left.exists()


def _step(run: Run, step: str, note: str, **extra: Any) -> None:
    run.note(note, step=step)
    run.payload.update(extra)


def _uncordon(run: Run, gpu: Gpu) -> None:
    if not run.payload.get("was_cordoned") and Gpu.objects.get(pk=gpu.pk).cordoned:
        gpu_set_cordon(gpu_id=gpu.pk, cordoned=False)
