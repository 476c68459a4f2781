"""``GET /allocations/{id}/what-would-it-take``: the smallest actions that would place a waiting
replica, ranked, each with the exact requests that apply it and whether the caller may
(:mod:`fleet.sharing.wit`). Every role reads it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.api.common import error_responses
from fleet.api.resources.wit.serializers import WhatWouldItTakeSerializer
from fleet.core.roles import Role, role_of
from fleet.core.teams import can_operate_team
from fleet.sharing.wit import answer_for, placing_now


def may_apply(user: Any, role: str, team_id: int) -> bool:
    if role == "team_operator":
        return can_operate_team(user, team_id)
    if role == "operator":
        return role_of(user) >= Role.OPERATOR
    if role == "admin":
        return role_of(user) >= Role.ADMIN
    return False


@extend_schema(
    operation_id="allocations_what_would_it_take",
    parameters=[
        OpenApiParameter(
            "id",
            str,
            OpenApiParameter.PATH,
            description="The waiting replica as `DEPLOYMENT.REPLICA` (the queue's `id`), or an "
            "allocation id (a placed replica: 409).",
        )
    ],
    responses={
        200: WhatWouldItTakeSerializer,
        **error_responses(
            401,
            403,
            described={
                404: "`replica.not_found`: no such deployment, replica or allocation",
                409: "`wit.placed`: the replica is placed; nothing needs to happen",
            },
        ),
    },
    description="What would it take to place this waiting replica? The smallest actions, "
    "ranked least harm first (stops, then moves, then a quota change, then reshapes): it fits "
    "now; `k` moves with the planner's proof that no plan moves fewer; one GPU reshaped by the "
    "layout advisor; borrowed replicas stopped as a reclaim would; its team's quota raised "
    "(when the quota blocks it: the exact `PUT /teams/{id}/quota` body); and, last, when it "
    "fits with nobody acting (`at` `null` where Fleet cannot say). Each plan is the exact "
    "requests that apply it and whether the caller's role may. Answers are computed in the "
    "background for every waiting replica and cached until the fleet changes; a miss is "
    "computed now (`cached`). The plans place the deployment's next waiting replica (its "
    "waiting replicas are alike).",
)
@api_view(["GET"])
def what_would_it_take(request: Request, id: str) -> Response:
    waiting, answer, cached = answer_for(id)
    user = request.user
    team_id = answer["team"]
    plans = [
        {**plan, "may_apply": bool(plan["requests"]) and may_apply(user, plan["role"], team_id)}
        for plan in answer["plans"]
    ]
    body = {
        **answer,
        "id": f"{waiting.deployment.pk}.{waiting.replica}",
        "replica": waiting.replica,
        "plans": plans,
        "cached": cached,
        "in_progress": placing_now(waiting.deployment),
    }
    return Response(WhatWouldItTakeSerializer(body).data)
