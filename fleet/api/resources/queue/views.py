"""``GET /queue/``: every replica without a place, in the order it is served, with its
position and what blocks it (:mod:`fleet.sharing.queue`). Every role reads it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.api.common import error_responses
from fleet.api.limits import throttle_scope
from fleet.api.resources.queue.serializers import QueueSerializer
from fleet.sharing.queue import QueueEntry, fleet_queue, half_life_s


def entry_body(entry: QueueEntry) -> dict[str, Any]:
    waiting = entry.queued.waiting
    return {
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
