"""``/allocations/``: replicas bound to partitions, their metrics, their move, and
``GET /allocations/{id}/logs`` (asked of the agent of its host, :mod:`fleet.agents.logs`)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.http import HttpResponse
from django.http.response import HttpResponseBase
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.decorators import action, api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.agents.logs import WAIT_S
from fleet.agents.logs import allocation_logs as replica_logs
from fleet.allocations.accounting.telemetry import replica_series
from fleet.allocations.models import Allocation
from fleet.allocations.moves import allocation_move
from fleet.api.common import ReadViewSet, documented_reads, error_responses, parse_id, validated
from fleet.api.filters import AllocationFilter
from fleet.api.permissions import authorize_allocation, authorize_replica_read
from fleet.api.resources.allocations.serializers import (
    AllocationSerializer,
    LogsQuerySerializer,
    LogsSerializer,
    MoveRequestSerializer,
    ReplicaMetricsQuerySerializer,
    ReplicaMetricsSerializer,
)
from fleet.api.resources.operations.serializers import OperationSerializer
from fleet.core.permissions import TeamRolePermission
from hostagent import protocol


@documented_reads(AllocationSerializer)
class AllocationViewSet(ReadViewSet[Allocation]):
    """Replicas bound to partitions. Capacity is counted from these reservations."""

    serializer_class = AllocationSerializer
    filterset_class = AllocationFilter
    ordering_fields = ["created_at", "deployment", "gpu"]
    permission_classes = [TeamRolePermission]
    team_actions = frozenset({"move"})
    queryset = Allocation.objects.select_related("deployment", "gpu__host", "partition").order_by(
        "deployment_id", "replica", "gpu_slot"
    )

    @extend_schema(
        parameters=[ReplicaMetricsQuerySerializer],
        responses={200: ReplicaMetricsSerializer, **error_responses(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        """The replica's utilisation and memory over a window (its team's members and fleet
        viewers and up; 403 `auth.forbidden` for another team's member): its MIG instance's,
        or its processes' memory (MPS), or its GPU's utilisation and its processes' memory
        (whole GPU). `null` where there is no value, never 0."""
        query = ReplicaMetricsQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        allocation = self.get_object()
        authorize_replica_read(request.user, allocation.pk)
        return Response(replica_series(allocation, window=query.validated_data["window"]))

    @extend_schema(
        request=MoveRequestSerializer,
        responses={202: OperationSerializer, **error_responses(400, 401, 403, 404, 409, 422)},
    )
    @action(detail=True, methods=["post"])
    def move(self, request: Request, pk: str | None = None) -> Response:
        """Move one replica, make before break: the new copy starts on the target and the old
        one stops only once it runs; a failure leaves the old copy running. The ``move``
        operation shows each step. The team's first move in flight is its one surge replica;
        past it, a new copy counts against the team's quota until its move ends: 422
        ``quota.exceeded`` (``details.surge_in_use``, ``details.moving``) when it does not fit,
        nothing changed."""
        authorize_allocation(request.user, parse_id(pk))
        data = validated(MoveRequestSerializer, request)
        operation = allocation_move(
            allocation_id=parse_id(pk),
            partition_id=data.get("partition"),
            gpu_id=data.get("gpu"),
            start=data.get("start"),
            timeout_s=data.get("timeout_s"),
            requested_by=request.user,
        )
        return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)


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
        ),
        OpenApiParameter(
            "before",
            int,
            description="Only lines older than this cursor (the first of `cursors` of an "
            "earlier answer): older lines on demand, `tail` at a time.",
        ),
        OpenApiParameter(
            "q",
            str,
            description=f"Only lines containing this text, compared without case (at most "
            f"{protocol.MAX_LOG_QUERY} characters): the agent searches all the output it keeps.",
        ),
        OpenApiParameter(
            "download",
            bool,
            description="`true`: the same lines as a `text/plain` attachment, one a line, each "
            "after its time (ISO 8601) where known.",
        ),
    ],
    responses={
        200: LogsSerializer,
        **error_responses(
            400,
            401,
            403,
            404,
            described={
                409: "`logs.agent_unreachable`: the host's agent has no open WebSocket "
                "(offline, or on the REST transport); `logs.no_older`: `before` was given for "
                "output that cannot be paged (a container's, or an older agent's)",
                504: f"`logs.timeout`: the agent did not answer within {WAIT_S:g} s",
            },
        ),
    },
    description=(
        "The last lines of one replica's output (its container's or process's stdout and "
        "stderr) with the time the agent captured each, fetched from the agent of its host "
        "while you wait (a few seconds at most). Older lines come with `before`, a search with "
        "`q`, a text file with `download=true`. Its team's members and fleet viewers and up "
        "read them; another team's member gets 403 `auth.forbidden`."
    ),
)
@api_view(["GET"])
def allocation_logs(request: Request, pk: int) -> HttpResponseBase:
    query = LogsQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    wanted = query.validated_data
    authorize_replica_read(request.user, pk)
    logs = replica_logs(
        allocation_id=pk, tail=wanted["tail"], before=wanted["before"], q=wanted["q"] or None
    )
    times = [None if ts is None else _iso(ts) for ts in logs.stamps]
    if wanted["download"]:
        text = "".join(
            f"{line}\n" if ts is None else f"{ts} {line}\n"
            for ts, line in zip(times, logs.lines, strict=True)
        )
        response = HttpResponse(text, content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="replica-{int(pk)}-logs.txt"'
        return response
    return Response(
        {
            "lines": logs.lines,
            "truncated": logs.truncated,
            "error": logs.error,
            "timestamps": times,
            "cursors": logs.seqs,
            "older_gone": logs.gone,
        }
    )


def _iso(ts: float) -> str:
    """Unix seconds as ISO 8601 in UTC, to the millisecond (``2026-12-04T15:40:42.123Z``)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
