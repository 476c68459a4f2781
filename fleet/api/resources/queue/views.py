"""``GET /queue/``: every replica without a place, in the order it is served, with its
position and what blocks it (:mod:`fleet.sharing.queue`). Every role reads it.
``/queue/reclaim/{deployment}``: what a reclaim would do for it (``GET``), and starting it now
(``POST``, fleet operators)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.api.common import error_responses, parse_id
from fleet.api.limits import throttle_scope
from fleet.api.resources.operations.serializers import OperationSerializer
from fleet.api.resources.queue.serializers import QueueSerializer, ReclaimPlanSerializer
from fleet.sharing.queue import QueueEntry, fleet_queue, half_life_s
from fleet.sharing.reclaim import Preview, reclaim_preview
from fleet.workflows.reclaim import reclaim_now


def entry_body(entry: QueueEntry) -> dict[str, Any]:
    waiting = entry.queued.waiting
    return {
        "id": f"{entry.deployment.pk}.{waiting.replica}",
        "position": entry.queued.position,
        "deployment": entry.deployment.pk,
        "deployment_name": entry.deployment.name,
        "replica": waiting.replica,
        "team": entry.team.pk,
        "team_name": entry.team.name,
        "priority": entry.priority,
        "priority_value": waiting.priority,
        "team_share": round(entry.queued.team_share, 6),
        "waiting_since": entry.waiting_since,
        "reason": entry.reason.as_dict(),
    }


@extend_schema(
    responses={200: QueueSerializer, **error_responses(401, 403, 429)},
    description="The waiting replicas in the order they are served: a higher priority class "
    "first, then the team with the smaller share of use (GPU-equivalents, decayed with "
    "half-life `FLEET_FAIRSHARE_HALF_LIFE_S`, divided by its `over_quota_weight`), then the "
    "longest waiting. Each has its `position` and the `reason` it waits now.",
)
@api_view(["GET"])
@throttle_scope("expensive")  # reads every deployment and ranks the waiting ones
def queue(request: Request) -> Response:
    entries = fleet_queue()
    return Response({"half_life_s": half_life_s(), "waiting": [entry_body(e) for e in entries]})


def _preview_body(preview: Preview) -> dict[str, Any]:
    plan, named = preview.plan, preview.allocations

    def move(m: Any) -> dict[str, Any]:
        a = named.get((m.kind, m.allocation_id))
        return {
            "allocation": a.pk if a else None,
            "deployment": a.deployment_id if a else None,
            "replica": a.replica if a else None,
            "from_gpu": m.from_gpu,
            "to_gpu": m.to_gpu,
        }

    stops = [named[b.key] for b in plan.stops]
    return {
        "action": plan.action,
        "code": preview.code,
        "reason": plan.reason,
        "target": (
            {"gpu": plan.target.gpu_id, "partition": plan.target.partition_id}
            if plan.target
            else None
        ),
        "moves": [move(m) for m in plan.moves],
        "stops": [
            {
                "allocation": a.pk,
                "deployment": a.deployment_id,
                "replica": a.replica,
                "team": a.deployment.team_id,
                "gpu": a.gpu_id,
            }
            for a in stops
        ],
    }


@extend_schema(
    methods=["GET"],
    responses={200: ReclaimPlanSerializer, **error_responses(401, 403, 404, 429)},
    description="What a reclaim would do, now, to place the deployment's next replica that its "
    "team's deserved share entitles: place it without touching anyone, else move other "
    "teams' borrowed replicas out of the way (fewest moves), else stop borrowed replicas "
    "(lowest priority, most recently started first, none younger than "
    "`FLEET_RECLAIM_MIN_RUNTIME_S`), else nothing (no net gain). A preview: nothing changes.",
)
@extend_schema(
    methods=["POST"],
    request=None,
    responses={202: OperationSerializer, **error_responses(401, 403, 404, 409, 429)},
    description="Fleet operators: start that reclaim now (what-would-it-take's `stop` plan). "
    "It is planned when it is sent, on the fleet as it is then, away from the GPUs of the "
    "reclaims running, and carried out as beat's sweep would (one `reclaim` operation: the "
    "moves make before break, then the stops, drained first, then the replica placed). 409: "
    "`reclaim.not_entitled` (past its team's deserved share), `reclaim.fits_now` (place it), "
    "`reclaim.no_gain` (no plan would place it: nothing is touched), `reclaim.in_progress`, "
    "`reclaim.gpus_busy` (it needs GPUs another reclaim is working on: retry after it).",
)
@api_view(["GET", "POST"])
@throttle_scope("expensive")  # runs the move planner on the whole fleet
def reclaim(request: Request, deployment_id: int) -> Response:
    if request.method == "POST":
        operation = reclaim_now(deployment_id=parse_id(deployment_id), requested_by=request.user)
        return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)
    return Response(_preview_body(reclaim_preview(parse_id(deployment_id))))
