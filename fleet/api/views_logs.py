"""``GET /api/v1/allocations/{id}/logs``: a replica's newest output lines, asked of the agent of
its host over its socket (:mod:`fleet.agents.logs`). Thin: parse, call, render."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.agents.logs import WAIT_S
from fleet.agents.logs import allocation_logs as replica_logs
from fleet.api import serializers as s
from fleet.api.common import ERRORS
from fleet.api.serializers_workloads import LogsQuerySerializer, LogsSerializer
from fleet.api.views_teams import authorize_replica_read
from hostagent import protocol


@extend_schema(
    operation_id="allocations_logs_retrieve",
    parameters=[
        OpenApiParameter(
            "tail",
            int,
            description=(
                f"Lines wanted, newest last (default {protocol.DEFAULT_LOG_LINES}, "
                f"at most {protocol.MAX_LOG_LINES})."
            ),
        )
    ],
    responses={
        200: LogsSerializer,
        **{code: ERRORS[code] for code in (400, 401, 403, 404)},
        409: OpenApiResponse(
            s.ErrorSerializer,
            description="`logs.agent_unreachable`: the host's agent has no open WebSocket "
            "(offline, or on the REST transport)",
        ),
        504: OpenApiResponse(
            s.ErrorSerializer,
            description=f"`logs.timeout`: the agent did not answer within {WAIT_S:g} s",
        ),
    },
    description=(
        "The last lines of one replica's output (its container's or process's stdout and "
        "stderr), fetched from the agent of its host while you wait (a few seconds at most). "
        "Its team's members and fleet viewers and up read them; another team's member gets "
        "403 `auth.forbidden`."
    ),
)
@api_view(["GET"])
def allocation_logs(request: Request, pk: int) -> Response:
    query = LogsQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    authorize_replica_read(request.user, pk)
    logs = replica_logs(allocation_id=pk, tail=query.validated_data["tail"])
    return Response({"lines": logs.lines, "truncated": logs.truncated, "error": logs.error})
