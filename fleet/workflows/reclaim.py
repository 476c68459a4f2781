"""The reclaim, carried out: a team takes its deserved share back from borrowers, least harm first.

The plan (:func:`fleet.allocations.reclaims.reclaim_plan_of`, simulated whole: with no net gain
nothing starts) is recorded as one ``reclaim`` operation naming the lender (the claimant's team),
the borrowers, each replica it moves or stops and why no fewer would do (``payload["bound"]``).
Then, each step waiting for the one before it:

1. ``moving``: the planned moves of borrowed replicas (or, where those alone make no room, of
   any replicas), make before break (the defrag's steps,
   :func:`fleet.workflows.defrag.advance_step`): the old copy keeps serving until the new one
   runs, so nobody loses a running replica;
2. ``stopping``: only if the claimant still does not fit, the plan is made again on the fleet as
   it is now and its stops carried out (an eviction: the replica drains from the load balancer
   for its endpoint's ``drain_s``, stops, and waits in the queue again; it is not deleted). With
   no net gain now, nothing is stopped and the reclaim fails. The stopped replicas' deployments
   are *claimed* off the GPUs they left (:mod:`fleet.allocations.claims`: no cycling);
3. ``releasing``: until the stopped replicas have exited; then ``reshaping``: the MIG slices
   they left are destroyed (the room the plan counted on);
4. ``placing``: the claimant's replica is placed (the engine's best target).

The engine (:mod:`fleet.workflows.engine`) advances it after agent acks and reports and from
beat; :func:`fleet.sharing.reclaiming.reclaims_start` starts one for the first waiting replica in
queue order that its team's deserved share entitles and that needs one. Webhooks hear
``reclaim.started`` and ``reclaim.finished`` (a failure: ``operation.failed``).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.models import Allocation, Deployment, RequestKind
from fleet.allocations.planning.repack_plans import step_of
from fleet.allocations.quotas import QuotaExceeded
from fleet.allocations.reclaims import reclaim_plan_of, running_reclaims, serialise_reclaims
from fleet.allocations.selectors import placement_request
from fleet.allocations.services import allocations_evict, lock_deployment
from fleet.core.alerts import RECLAIM_FINISHED, RECLAIM_STARTED, alert_emit
from fleet.core.errors import Conflict, ServiceError
from fleet.core.jobs import advance_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus, Team
from fleet.core.operations import RUNNING, operation_record, operation_refuse_running
from fleet.partitioning.instances import instance_destroy
from fleet.partitioning.models import Partition
from fleet.placement.defrag import DEFAULT_MAX_MOVES
from fleet.placement.reclaim import ReclaimPlan, plan_gpus
from fleet.placement.snapshot import WholeGpuRequest
from fleet.workflows.defrag import STEP_LABELS, advance_step, move_timeout_s
from fleet.workflows.engine import WAIT, Outcome, Run, Workflow, workflow_run

STEPS = {
    **{k: v for k, v in STEP_LABELS.items() if k not in ("done", "failed")},
    "stopping": "Stopping borrowed replicas, if still needed",
    "releasing": "Waiting for the stopped replicas to drain and exit",
    "placing": "Placing the claimant",
    "done": "Done",
    "failed": "Failed",
}


def _named(a: Allocation) -> dict[str, Any]:
    d = a.deployment
    return {
        "allocation": a.pk,
        "deployment": d.pk,
        "name": f"{d.name}[{a.replica}]",
        "replica": a.replica,
        "team": d.team_id,
        "gpu": a.gpu_id,
    }


def bound_of(plan: ReclaimPlan, deployment: Deployment, others_moved: int = 0) -> str:
    """Why no fewer replicas would do: what the planner tried before it settled on this plan
    (``others_moved``: how many of its moves take replicas that are not borrowed)."""
    whole = isinstance(placement_request(deployment), WholeGpuRequest)
    no_moves = (
        "whole-GPU replicas are not moved"
        if whole
        else f"no plan of at most {DEFAULT_MAX_MOVES} moves of borrowed replicas makes room"
    )
    min_runtime = int(float(settings.FLEET_RECLAIM_MIN_RUNTIME_S))
    if plan.action == "move":
        n = len([m for m in plan.moves if m.occupied])
        if not others_moved:
            return (
                f"{n} move(s): no smaller set of borrowed replicas moved elsewhere makes room "
                "(every smaller set on every GPU the replica could use was tried); nobody is "
                "stopped"
            )
        return (
            f"{n} move(s), {others_moved} of them not borrowed: no plan of at most "
            f"{DEFAULT_MAX_MOVES} moves of borrowed replicas alone makes room, and no smaller "
            "set of replicas moved elsewhere does; a move costs nobody a running replica, so "
            "nobody is stopped"
        )
    n = len(plan.stops)
    if any(m.occupied for m in plan.moves):
        return (
            f"{n} stop(s) and {len([m for m in plan.moves if m.occupied])} move(s): {no_moves}, "
            "and no host's stops alone place it; on the chosen GPU its borrowed replicas "
            "that may stop stop and its other replicas move elsewhere first (make before "
            "break), the GPU needing the fewest stops, then moves"
        )
    return (
        f"{n} stop(s): {no_moves}; on the chosen host, stopping fewer in stop order (lowest "
        f"priority, then most recently started; none younger than {min_runtime} s) does not "
        "place it, and no other host needs fewer stops"
    )


def reclaim_start(
    *, deployment_id: int, requested_by: Any = None, avoid_gpus: Collection[int] = ()
) -> Operation:
    """Start a reclaim for the deployment's next replica; returns the ``reclaim`` operation.
    Refuses (409) when a reclaim of it runs, when it is not entitled (``reclaim.not_entitled``),
    when it fits without one (``reclaim.fits_now``), when no plan gains anything
    (``reclaim.no_gain``) or when its plan touches one of ``avoid_gpus`` (those of the reclaims
    running: ``reclaim.gpus_busy``): nothing is touched then. The GPUs it touches are
    ``payload["gpus"]``.

    Locks the claimant's deployment row, then the teams' rows (the lender's and the borrowers',
    in id order), as a placement locks them."""
    deployment = lock_deployment(deployment_id)
    operation_refuse_running(
        OperationKind.RECLAIM,
        "reclaim.in_progress",
        f"A reclaim for {deployment.name} is already running (operation {{operation}}).",
        deployment=deployment,
    )
    preview = reclaim_plan_of(
        Deployment.objects.select_related("team").get(pk=deployment_id), avoid_gpus
    )
    plan = preview.plan
    if preview.code:
        raise Conflict(preview.code, plan.reason, {"deployment": deployment_id})
    if plan.action == "place":
        raise Conflict(
            "reclaim.fits_now",
            f"The next replica of {deployment.name} fits without a reclaim: place it.",
            {"deployment": deployment_id},
        )
    if plan.action == "none":
        raise Conflict("reclaim.no_gain", plan.reason, {"deployment": deployment_id})
    if plan.action == "stop" and avoid_gpus:
        # Planned away from the running reclaims' GPUs, it stops replicas: only if the whole
        # fleet needs that too. Where moves onto those GPUs would do, it waits for them.
        whole = reclaim_plan_of(Deployment.objects.select_related("team").get(pk=deployment_id))
        if whole.plan.action != "stop":
            raise Conflict(
                "reclaim.gpus_busy",
                f"{deployment.name} needs GPUs other reclaims are working on: it waits for them "
                "rather than stop a replica that moves would spare.",
                {"deployment": deployment_id, "gpus": sorted(avoid_gpus)},
            )
    gpus = plan_gpus(plan)
    busy = sorted(gpus & set(avoid_gpus))
    if busy:
        raise Conflict(
            "reclaim.gpus_busy",
            f"The plan for {deployment.name} touches GPUs another reclaim is working on.",
            {"deployment": deployment_id, "gpus": busy},
        )
    named = preview.allocations
    moved = [named[(m.kind, m.allocation_id)] for m in plan.moves if m.occupied]
    stopped = [named[b.key] for b in plan.stops]
    # Borrowers: the teams whose borrowed replicas it moves or stops (a guaranteed replica
    # moved out of the way loses nothing and makes its team no borrower).
    borrower_ids = sorted({a.deployment.team_id for a in moved + stopped if a.borrowed})
    touched = {a.deployment.team_id for a in moved + stopped}
    teams = {
        t.pk: t
        for t in Team.objects.select_for_update()
        .filter(pk__in=sorted({deployment.team_id, *touched}))
        .order_by("pk")
    }
    lender = teams[deployment.team_id]
    borrowers: list[dict[str, Any]] = [{"team": pk, "name": teams[pk].name} for pk in borrower_ids]
    steps = [step_of(m) for m in plan.moves]
    for step, m in zip(steps, plan.moves, strict=True):
        a = named.get((m.kind, m.allocation_id))
        if a is not None:
            step.update({"name": _named(a)["name"], "team": a.deployment.team_id})
    others_moved = sum(1 for a in moved if not a.borrowed)
    what = (
        f"move {len(moved)} replica(s) ({len(moved) - others_moved} borrowed)"
        if plan.action == "move"
        else f"stop {len(stopped)} borrowed replica(s)"
        + (f" after moving {len(moved)} other(s)" if moved else "")
    )
    now = timezone.now()
    bound = bound_of(plan, deployment, others_moved)
    payload: dict[str, Any] = {
        "claimant": {"deployment": deployment.pk, "name": deployment.name, "team": lender.pk},
        "lender": {"team": lender.pk, "name": lender.name},
        "borrowers": borrowers,
        "action": plan.action,
        "plan": steps,
        "index": 0,
        "planned_stops": [_named(a) for a in stopped],
        "stopped": [],
        "claims": [],
        "bound": bound,
        "target": {"gpu": plan.target.gpu_id, "partition": plan.target.partition_id}
        if plan.target
        else None,
        "step": "start",
        "gpus": sorted(gpus),
        "log": [{"step": None, "note": f"plan accepted: {what}; {bound}", "at": now.isoformat()}],
        "deadline": (
            now + timedelta(seconds=move_timeout_s() * (len(steps) + 2) + 300)
        ).isoformat(),
    }
    operation = operation_record(
        kind=OperationKind.RECLAIM,
        summary=f"Reclaim for {lender.name} ({deployment.name}): {what} of "
        + ", ".join(teams[pk].name for pk in sorted(touched)),
        requested_by=requested_by,
        deployment=deployment,
        status=OperationStatus.DISPATCHED,
        payload=payload,
    )
    alert_emit(
        event=RECLAIM_STARTED,
        summary=operation.summary,
        subject=_subject(operation, payload),
    )
    advance_after_commit(operation.pk)
    return operation


def reclaim_now(*, deployment_id: int, requested_by: Any = None) -> Operation:
    """An operator's reclaim for the deployment's next replica, started now
    (``POST /queue/reclaim/{deployment}``: what-would-it-take's ``stop`` plan applies it). It is
    planned when it is sent, on the fleet as it is then (moves where they now suffice), away
    from the GPUs of the reclaims running, as a sweep starts one (serialised with the sweeps):
    the refusals of :func:`reclaim_start`. The sweep's bound on reclaims at once is not
    applied: a person decided this one, and no two reclaims touch the same GPU anyway."""
    with transaction.atomic():
        serialise_reclaims()
        _claimants, busy, known = running_reclaims()
        if not known:
            raise Conflict(
                "reclaim.gpus_busy",
                "A reclaim started by an older server is running and does not say which GPUs it "
                "touches: retry once it has finished.",
                {"deployment": deployment_id},
            )
        return reclaim_start(
            deployment_id=deployment_id, requested_by=requested_by, avoid_gpus=busy
        )


def _subject(operation: Operation, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "operation": {"id": operation.pk, "kind": operation.kind},
        "deployment": {
            "id": payload["claimant"]["deployment"],
            "name": payload["claimant"]["name"],
        },
        "lender": {"id": payload["lender"]["team"], "name": payload["lender"]["name"]},
        "borrowers": [{"id": b["team"], "name": b["name"]} for b in payload["borrowers"]],
        "moves": [s.get("name") for s in payload["plan"] if s.get("kind") == "move"],
        "stops": [s["name"] for s in payload.get("stopped") or payload["planned_stops"]],
        "bound": payload["bound"],
    }


class Reclaim(Workflow):
    kind = OperationKind.RECLAIM
    steps = STEPS

    def advance(self, run: Run) -> Outcome:
        operation, payload = run.operation, run.payload
        if operation.deployment_id is None:
            return run.fail("the claimant's deployment was deleted")
        # Before any row lock of its steps (a sweep takes this lock first, then rows): another
        # reclaim choosing its stops, or a sweep starting one, sees this one's choices.
        serialise_reclaims()
        while payload["index"] < len(payload["plan"]):
            step = payload["plan"][payload["index"]]
            outcome = advance_step(run, step, payload, f"move {payload['index'] + 1}")
            if outcome != "next":
                return outcome
            payload["index"] += 1
            payload["step"] = "start"
        if payload["step"] == "start":
            payload["step"] = "stopping"
        if payload["step"] == "stopping":
            failed = _stop_if_needed(run, operation.deployment_id)
            if failed is not None:
                return failed
        if payload["step"] == "releasing":
            ids = [s["allocation"] for s in payload["stopped"]]
            if Allocation.objects.filter(pk__in=ids).exists():
                return WAIT
            run.note("the stopped replicas have exited", step="reshaping")
        if payload["step"] == "reshaping":
            reshaped = _destroy_freed(run)
            if reshaped is not None:
                return reshaped
            payload["step"] = "placing"
        return _place(run, operation.deployment_id)

    def timeout_reason(self, run: Run) -> str:
        return f"the reclaim did not finish in time ({run.payload.get('step')})"


def _fully_placed(deployment_id: int) -> bool:
    deployment = Deployment.objects.get(pk=deployment_id)
    placed = deployment.allocations.placed().values("replica").distinct().count()
    return placed >= deployment.replicas


def _stop_if_needed(run: Run, deployment_id: int) -> Outcome | None:
    """The stops, only if the claimant still does not fit: planned again on the fleet as it is
    (no net gain now: nothing stopped, the reclaim fails)."""
    payload = run.payload
    if _fully_placed(deployment_id):
        run.note("the claimant has a place already; nothing stopped", step="placing")
        return None
    claimant = Deployment.objects.select_related("team").get(pk=deployment_id)
    _, others, _ = running_reclaims(exclude=run.operation.pk)
    preview = reclaim_plan_of(claimant, others)  # away from the other reclaims' GPUs
    plan = preview.plan
    if plan.action == "place":
        moved = "the moves made room" if payload["plan"] else "it fits now"
        run.note(f"{moved}: nothing stopped", step="placing")
        return None
    if plan.action != "stop" and others and reclaim_plan_of(claimant).plan.action != "none":
        return _wait_for_others(run, "what it needs is on GPUs other reclaims are working on")
    if plan.action != "stop":
        why = preview.code or plan.reason or f"it would take more moves ({len(plan.moves)})"
        return run.fail(f"nothing stopped: no net gain now ({why})")
    if others and reclaim_plan_of(claimant).plan.action != "stop":
        return _wait_for_others(run, "moves onto GPUs other reclaims are working on would spare")
    stopped = [preview.allocations[b.key] for b in plan.stops]
    # Planned again, it may touch other GPUs: the next sweeps keep away from them too.
    payload["gpus"] = sorted(set(payload.get("gpus", ())) | plan_gpus(plan))
    by_deployment: dict[int, list[int]] = {}
    for a in stopped:
        by_deployment.setdefault(a.deployment_id, []).append(a.pk)
    # Every borrower's deployment row first (id order), then the hosts (allocations_evict).
    locked = {pk: lock_deployment(pk, allow_deleting=True) for pk in sorted(by_deployment)}
    ids = [pk for pks in by_deployment.values() for pk in pks]
    if Allocation.objects.placed().filter(pk__in=ids, borrowed=True).count() != len(ids):
        # Changed since the plan read it (under the deployments' locks now): planned again.
        return _wait_for_others(run, "a borrowed replica to stop changed meanwhile")
    for pk, pks in by_deployment.items():
        allocations_evict(
            deployment=locked[pk],
            allocations=Allocation.objects.placed().filter(pk__in=pks, borrowed=True),
            requested_by=run.operation.requested_by,
        )
    payload["stopped"] = [_named(a) for a in stopped]
    payload["destroy"] = sorted(a.partition_id for a in stopped if a.kind == RequestKind.MIG)
    payload["claims"] = [
        {
            "deployment": pk,
            "gpus": sorted({a.gpu_id for a in stopped if a.deployment_id == pk}),
        }
        for pk in sorted(by_deployment)
    ]
    payload["bound"] = bound_of(plan, claimant)
    names = ", ".join(s["name"] for s in payload["stopped"])
    run.note(f"stopped {names} (they drain, exit and wait in the queue)", step="releasing")
    return None


def _wait_for_others(run: Run, why: str) -> Outcome:
    """Nothing stopped yet: the stopping step waits for the other reclaims (and defrags) to
    end (their GPUs free again), said once in the log."""
    waiting = f"waiting for the other reclaims and defrags: {why}"
    if run.payload.get("waiting_for") != waiting:
        run.note(waiting)
        run.payload["waiting_for"] = waiting
    return WAIT


def _destroy_freed(run: Run) -> Outcome | None:
    """The MIG slices the stopped replicas left, destroyed (the room the plan counted on: a
    placement never destroys another instance); ``None`` once every one is gone."""
    payload = run.payload
    layouts: list[int] = payload.setdefault("layouts", [])
    done: list[int] = payload.setdefault("destroyed", [])
    for partition_id in payload.get("destroy", []):
        if partition_id in done:
            continue
        done.append(partition_id)
        partition = Partition.objects.filter(pk=partition_id).first()
        if partition is None or partition.allocations.exists():
            continue
        layout = instance_destroy(partition, requested_by=run.operation.requested_by)
        run.adopt(layout)
        layouts.append(layout.pk)
        run.note(f"destroying the slice {partition} left (operation {layout.pk})")
    statuses = Operation.objects.filter(pk__in=layouts).values_list("status", flat=True)
    if any(status in RUNNING for status in statuses):
        return WAIT
    if any(status != OperationStatus.SUCCEEDED for status in statuses):
        return run.fail("destroying a slice a stopped replica left failed")
    return None


def _place(run: Run, deployment_id: int) -> Outcome:
    payload = run.payload
    if _fully_placed(deployment_id):
        return _succeed(run, "the claimant has a place already", [])
    try:
        with transaction.atomic():
            placed = deployment_autoplace(deployment_id=deployment_id, limit=1)
    except QuotaExceeded as error:
        return run.fail(f"the claimant may no longer be placed: {error.message}")
    except ServiceError as error:  # capacity still held (a copy still exiting): retry
        waiting = f"waiting to place the claimant: {error.message}"
        if payload.get("waiting_for") != waiting:
            run.note(waiting)
            payload["waiting_for"] = waiting
        return WAIT
    payload["placed"] = [op.pk for op in placed]
    return _succeed(run, placed[0].summary if placed else "nothing left to place", placed)


def _succeed(run: Run, where: str, placed: list[Operation]) -> Outcome:
    payload = run.payload
    moved = sum(1 for s in payload["plan"] if s.get("kind") == "move" and s.get("move"))
    reason = f"moved {moved}, stopped {len(payload['stopped'])}; {where}"
    alert_emit(
        event=RECLAIM_FINISHED,
        summary=f"{run.operation.summary}: {reason}",
        subject=_subject(run.operation, payload),
    )
    result = {
        "moved": moved,
        "stopped": [s["allocation"] for s in payload["stopped"]],
        "placed": [op.pk for op in placed],
    }
    return run.succeed(reason, result)


WORKFLOW = Reclaim()


def reclaim_advance(*, operation_id: int) -> str:
    """Move the reclaim on as far as it can go now: ``wait``, ``done`` or ``failed``."""
    return workflow_run(WORKFLOW, operation_id)
