"""``/gpus/``: GPUs, their history, and the layout, cordon, drain, heal and forget commands."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.allocations.drain import gpu_drain
from fleet.api.common import ReadViewSet, documented_reads, error_responses, parse_id, validated
from fleet.api.resources.gpus.serializers import (
    DrainSerializer,
    GpuHistoryQuerySerializer,
    GpuHistorySerializer,
    GpuSerializer,
)
from fleet.api.resources.mig.serializers import LayoutSerializer
from fleet.api.resources.operations.serializers import OperationSerializer
from fleet.core.roles import Role
from fleet.inventory import services as inventory_services
from fleet.inventory.filters import GpuFilter
from fleet.inventory.models import Gpu
from fleet.inventory.selectors import HISTORY_WINDOWS, gpu_history_series, latest_telemetry_of
from fleet.inventory.telemetry import METRICS
from fleet.partitioning import services as partitioning_services
from fleet.workflows.health import gpu_heal


@documented_reads(GpuSerializer)
class GpuViewSet(ReadViewSet[Gpu]):
    """GPUs with their sharing mode, health and cordon state. Commands: layout, cordon, uncordon."""

    serializer_class = GpuSerializer
    filterset_class = GpuFilter
    required_roles = {"forget": Role.ADMIN}

    def get_serializer(self, *args: Any, **kwargs: Any) -> Any:
        """Read the latest telemetry of every GPU of the page in one round trip."""
        rows = args[0] if args else None
        if rows is not None and not isinstance(rows, dict):
            many = list(rows) if kwargs.get("many") else [rows]
            kwargs.setdefault("context", self.get_serializer_context())
            kwargs["context"]["latest_telemetry"] = latest_telemetry_of(many)
            args = (many if kwargs.get("many") else rows, *args[1:])
        return super().get_serializer(*args, **kwargs)

    ordering_fields = ["host__name", "index", "product_name", "mode", "health"]
    queryset = Gpu.objects.select_related("host").order_by("host__name", "index")

    @extend_schema(
        parameters=[GpuHistoryQuerySerializer],
        responses={200: GpuHistorySerializer, **error_responses(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["get"], pagination_class=None, filterset_class=None)
    def history(self, request: Request, pk: str | None = None) -> Response:
        """The GPU's utilisation, memory, temperature and power over a window (any role), in
        equal buckets; `null` where there is no value, never 0."""
        query = GpuHistoryQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        gpu = self.get_object()
        window = query.validated_data["window"]
        bucket_s, points = gpu_history_series(gpu.pk, seconds=HISTORY_WINDOWS[window])
        body = {
            "gpu": gpu.pk,
            "window": window,
            "bucket_s": bucket_s,
            "points": [
                {"t": p["ts"], **{m: _rounded(p[m]) for m in METRICS}}  # type: ignore[literal-required]
                for p in points
            ],
        }
        return Response(body)

    @extend_schema(
        request=LayoutSerializer,
        responses={
            202: OperationSerializer,
            200: OperationSerializer,
            **error_responses(400, 401, 403, 404, 409, 422),
        },
        description=(
            "Set the GPU's layout: "
            '`{"mode": "mig", "instances": [{"profile": "3g.40gb", "start": 4}]}`, '
            '`{"mode": "mps", "mps": {...}}` or `{"mode": "dedicated"}`. Returns the operation '
            "(202 while the agent applies it; 200 when nothing changed)."
        ),
    )
    @action(detail=True, methods=["put"], url_path="layout")
    def layout(self, request: Request, pk: str | None = None) -> Response:
        spec = partitioning_services.LayoutSpec.from_json(validated(LayoutSerializer, request))
        operation = partitioning_services.gpu_set_layout(
            gpu_id=parse_id(pk), spec=spec, requested_by=request.user
        )
        code = status.HTTP_200_OK if operation.status == "succeeded" else status.HTTP_202_ACCEPTED
        return Response(OperationSerializer(operation).data, status=code)

    @extend_schema(
        request=None, responses={200: OperationSerializer, **error_responses(401, 403, 404)}
    )
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, pk: str | None = None) -> Response:
        reason = str(request.data.get("reason", ""))[:255] if isinstance(request.data, dict) else ""
        operation = partitioning_services.gpu_set_cordon(
            gpu_id=parse_id(pk), cordoned=True, reason=reason, requested_by=request.user
        )
        return Response(OperationSerializer(operation).data)

    @extend_schema(
        request=DrainSerializer,
        responses={202: OperationSerializer, **error_responses(400, 401, 403, 404, 409, 422)},
        description=(
            "Drain one GPU: cordon it, move (or stop) its replicas, and when its agent confirms "
            "it is idle apply `layout` (if given), verify it and uncordon; a failed apply rolls "
            "back to the previous layout. Progress is in the returned operation's `payload`."
        ),
    )
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str | None = None) -> Response:
        data = validated(DrainSerializer, request)
        raw = data.get("layout")
        layout = partitioning_services.LayoutSpec.from_json(raw) if raw else None
        operation = gpu_drain(
            gpu_id=parse_id(pk),
            layout=layout,
            timeout_s=data["timeout_s"],
            requested_by=request.user,
        )
        return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None,
        responses={200: OperationSerializer, **error_responses(401, 403, 404, 409)},
        description="Return an unhealthy or lost GPU to service (after a reset, say).",
    )
    @action(detail=True, methods=["post"])
    def heal(self, request: Request, pk: str | None = None) -> Response:
        operation = gpu_heal(gpu_id=parse_id(pk), requested_by=request.user)
        return Response(OperationSerializer(operation).data)

    @extend_schema(
        request=None, responses={200: OperationSerializer, **error_responses(401, 403, 404)}
    )
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, pk: str | None = None) -> Response:
        operation = partitioning_services.gpu_set_cordon(
            gpu_id=parse_id(pk), cordoned=False, requested_by=request.user
        )
        return Response(OperationSerializer(operation).data)

    @extend_schema(
        request=None,
        responses={200: OperationSerializer, **error_responses(401, 403, 404, 409)},
        description=(
            "Admin: forget a GPU the inventory holds for a host, so that the host that has it "
            "now adopts it with its next hello (a GPU moved between hosts: its new host's "
            "reports are ignored, with a `gpu_conflict` event on both hosts, while the old one "
            "holds its UUID). 409 `gpu.in_use` while replicas are placed on it, "
            "`gpu.still_reported` while its host still reports it (revoke that host's token "
            "first if it claims a GPU that is not its own)."
        ),
    )
    @action(detail=True, methods=["post"])
    def forget(self, request: Request, pk: str | None = None) -> Response:
        operation = inventory_services.gpu_forget(gpu_id=parse_id(pk), requested_by=request.user)
        return Response(OperationSerializer(operation).data)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
