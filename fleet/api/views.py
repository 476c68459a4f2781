"""REST API v1: read viewsets with explicit command actions. Thin: parse, call a service, render."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import Count, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action, api_view
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.agents.host_tokens import host_token_rotate
from fleet.allocations.drain import gpu_drain
from fleet.allocations.maintenance import host_cordon, host_drain, host_uncordon, scheduled_drains
from fleet.api import serializers as s
from fleet.api import serializers_metrics as smx
from fleet.api import serializers_mig as sm
from fleet.api.common import ReadViewSet, documented_reads, error_responses, parse_id, validated
from fleet.api.export import CsvRenderer, operations_csv
from fleet.api.filters import (
    HealthEventFilter,
    HostFilter,
    PartitionFilter,
)
from fleet.core.errors import ServiceError
from fleet.core.filters import OperationFilter
from fleet.core.models import ApiToken, Operation
from fleet.core.roles import Role, role_of
from fleet.core.services import api_token_create, api_token_revoke
from fleet.inventory import services as inventory_services
from fleet.inventory.filters import GpuFilter
from fleet.inventory.models import Gpu, HealthEvent, Host
from fleet.inventory.reservations import host_set_reservation
from fleet.inventory.selectors import HISTORY_WINDOWS, gpu_history_series, latest_telemetry_of
from fleet.inventory.telemetry import METRICS
from fleet.partitioning import services as partitioning_services
from fleet.partitioning.models import Partition
from fleet.workflows.health import gpu_heal


@documented_reads(s.HostSerializer)
class HostViewSet(mixins.CreateModelMixin, ReadViewSet[Host]):
    """Hosts running the agent. Admins create them and receive the one-time enrollment token,
    and reserve them for teams; operators edit labels (PATCH) and cordon, uncordon and drain
    them."""

    serializer_class = s.HostSerializer
    filterset_class = HostFilter
    ordering_fields = ["name", "status", "last_seen_at"]
    required_roles = {
        "create": Role.ADMIN,
        "revoke_token": Role.ADMIN,
        "rotate_token": Role.ADMIN,
        "reservation": Role.ADMIN,
    }
    http_method_names = ["get", "post", "put", "patch", "head", "options"]

    def get_queryset(self) -> QuerySet[Host]:
        return (
            Host.objects.annotate(gpu_count=Count("gpus"))
            .prefetch_related("reserved_for")
            .order_by("name")
        )

    def get_serializer(self, *args: Any, **kwargs: Any) -> Any:
        """Read the open drains of every host of the page in one query."""
        rows = args[0] if args else None
        if rows is not None and not isinstance(rows, dict):
            many = list(rows) if kwargs.get("many") else [rows]
            kwargs.setdefault("context", self.get_serializer_context())
            kwargs["context"]["drains"] = scheduled_drains([h.pk for h in many])
            args = (many if kwargs.get("many") else rows, *args[1:])
        return super().get_serializer(*args, **kwargs)

    def _host(self, host_id: int) -> dict[str, Any]:
        return dict(self.get_serializer(self.get_queryset().get(pk=host_id)).data)

    @extend_schema(
        request=s.HostUpdateSerializer,
        responses={200: s.HostSerializer, **error_responses(400, 401, 403, 404)},
        description=(
            'Replace the host\'s labels: `{"labels": {"zone": "a"}}` (operators and admins). At '
            "most 32 labels; keys like Kubernetes label keys (an optional `prefix/`, then "
            "letters, digits, `-`, `_`, `.`), at most 63 characters; values at most 63 printable "
            "characters. Placed replicas stay; deployments that require labels (`host_labels`) "
            "are placed only on hosts carrying them. Any other field is a 400."
        ),
    )
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        host_id = parse_id(kwargs.get("pk"))
        if not isinstance(request.data, Mapping):
            raise ServiceError("malformed_request", "The body must be a JSON object.")
        unknown = sorted(str(k) for k in request.data if k != "labels")
        if unknown or "labels" not in request.data:
            raise ServiceError(
                "host.field_immutable",
                "Only 'labels' can be changed on a host.",
                {"fields": unknown},
            )
        inventory_services.host_set_labels(
            host_id=host_id, labels=request.data["labels"], requested_by=request.user
        )
        return Response(self._host(host_id))

    @extend_schema(
        request=None,
        responses={200: s.HostSerializer, **error_responses(401, 403, 404, 409)},
        description=(
            "Cordon a ready host: it keeps what it runs and takes no new replica (the placement "
            "engine refuses it with `placement.cordoned`). 409 `host.not_ready` for an offline "
            "or unhealthy host, `host.held` for one draining or in maintenance."
        ),
    )
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, pk: str | None = None) -> Response:
        host_cordon(host_id=parse_id(pk), requested_by=request.user)
        return Response(self._host(parse_id(pk)))

    @extend_schema(
        request=None,
        responses={200: s.HostSerializer, **error_responses(401, 403, 404, 409)},
        description=(
            "Return a cordoned, draining or maintenance host to service (`ready`) and cancel "
            "its drain, scheduled or running (the replicas already moved stay where they went). "
            "On a ready host with a scheduled drain it only cancels the drain; 409 "
            "`host.not_cordoned` when there is nothing to undo."
        ),
    )
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, pk: str | None = None) -> Response:
        host_uncordon(host_id=parse_id(pk), requested_by=request.user)
        return Response(self._host(parse_id(pk)))

    @extend_schema(
        request=s.HostDrainSerializer,
        responses={202: s.OperationSerializer, **error_responses(400, 401, 403, 404, 409)},
        description=(
            "Drain the host: it takes no new replicas (`draining`), its replicas move off one at "
            "a time, make before break (each new copy runs elsewhere before the old one stops), "
            "and once it is empty it is `maintenance` until uncordoned. A replica with nowhere "
            "to go is reported in the operation's `payload.stuck` and tried again until "
            "`timeout_s` (then the drain fails and the host stays cordoned); `force: true` stops "
            "such replicas instead. `at` (in the future, at most 30 days ahead) schedules the "
            "drain: the operation stays `pending` with step `scheduled` until then, and "
            "`POST /hosts/{id}/uncordon` cancels it. 409 `host.drain_in_progress`, "
            "`host.not_ready`; 400 `drain.at_invalid`."
        ),
    )
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str | None = None) -> Response:
        data = validated(s.HostDrainSerializer, request)
        operation = host_drain(
            host_id=parse_id(pk),
            at=data.get("at"),
            force=data["force"],
            timeout_s=data["timeout_s"],
            requested_by=request.user,
        )
        return Response(s.OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=s.HostReservationSerializer,
        responses={200: s.HostSerializer, **error_responses(400, 401, 403, 404)},
        description=(
            'Reserve the host for some teams (admins): `{"teams": ["search", 3]}` (slugs or '
            "ids). From then on the placement engine puts only those teams' deployments' "
            "replicas on it, on every path (place, auto-placement, scale, moves, drains, "
            "re-placement after a fault, repack, defragmentation); another team's replica is "
            "refused with `placement.host_reserved`, and the drag preview lists it so. "
            "Replicas already on the host stay, whatever their team: nothing is evicted. "
            '`{"teams": []}` lifts the reservation. Recorded as a `reserve_host` operation. '
            "400 `team.not_found` (`details.teams`: those not found), `reservation.invalid`."
        ),
    )
    @action(detail=True, methods=["put"])
    def reservation(self, request: Request, pk: str | None = None) -> Response:
        data = validated(s.HostReservationSerializer, request)
        host_set_reservation(host_id=parse_id(pk), teams=data["teams"], requested_by=request.user)
        return Response(self._host(parse_id(pk)))

    @extend_schema(
        request=None, responses={200: s.HostSerializer, **error_responses(401, 403, 404)}
    )
    @action(detail=True, methods=["post"], url_path="revoke-token")
    def revoke_token(self, request: Request, pk: str | None = None) -> Response:
        """Revoke the host's agent token: its requests are refused and its open sockets closed
        at once. The agent needs a new enrollment token (`POST /hosts/` or the admin) after."""
        host = self.get_object()
        inventory_services.host_revoke_token(host_id=host.pk, requested_by=request.user)
        return Response(s.HostSerializer(self.get_queryset().get(pk=host.pk)).data)

    @extend_schema(
        request=None,
        parameters=[s.HostRotateTokenQuerySerializer],
        responses={200: s.HostTokenRotatedSerializer, **error_responses(400, 401, 403, 404)},
        description=(
            "Give the host a new agent token (admins), returned once in `token`. If the agent "
            "is connected over WebSocket the new token is pushed to it (a `host_token` "
            "message): it stores it and carries on. The old token is still accepted for an "
            "hour (`previous_token_expires_at`), or until the agent uses the new one. "
            "`?revoke=true`: the old token is refused at once and the host's sockets are "
            "closed; nothing is pushed, so install the returned token on the host (its token "
            "file) yourself. Recorded as a `rotate_host_token` operation (without the token). "
            "Tokens also renew by themselves: see `token_expires_at`."
        ),
    )
    @action(detail=True, methods=["post"], url_path="rotate-token")
    def rotate_token(self, request: Request, pk: str | None = None) -> Response:
        query = s.HostRotateTokenQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        host = self.get_object()
        _, token = host_token_rotate(
            host_id=host.pk, revoke=query.validated_data["revoke"], requested_by=request.user
        )
        body = s.HostTokenRotatedSerializer(self.get_queryset().get(pk=host.pk)).data
        return Response({**body, "token": token})

    @extend_schema(
        request=s.HostCreateSerializer,
        responses={201: s.HostCreatedSerializer, **error_responses(400, 401, 403, 409)},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = validated(s.HostCreateSerializer, request)
        host, token = inventory_services.host_create(
            name=data["name"], labels=data.get("labels", {}), requested_by=request.user
        )
        body = s.HostCreatedSerializer(self.get_queryset().get(pk=host.pk)).data
        return Response({**body, "enrollment_token": token}, status=status.HTTP_201_CREATED)


@documented_reads(s.GpuSerializer)
class GpuViewSet(ReadViewSet[Gpu]):
    """GPUs with their sharing mode, health and cordon state. Commands: layout, cordon, uncordon."""

    serializer_class = s.GpuSerializer
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
        parameters=[smx.GpuHistoryQuerySerializer],
        responses={200: smx.GpuHistorySerializer, **error_responses(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["get"], pagination_class=None, filterset_class=None)
    def history(self, request: Request, pk: str | None = None) -> Response:
        """The GPU's utilisation, memory, temperature and power over a window (any role), in
        equal buckets; `null` where there is no value, never 0."""
        query = smx.GpuHistoryQuerySerializer(data=request.query_params.dict())
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
        request=sm.LayoutSerializer,
        responses={
            202: s.OperationSerializer,
            200: s.OperationSerializer,
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
        spec = partitioning_services.LayoutSpec.from_json(validated(sm.LayoutSerializer, request))
        operation = partitioning_services.gpu_set_layout(
            gpu_id=parse_id(pk), spec=spec, requested_by=request.user
        )
        code = status.HTTP_200_OK if operation.status == "succeeded" else status.HTTP_202_ACCEPTED
        return Response(s.OperationSerializer(operation).data, status=code)

    @extend_schema(
        request=None, responses={200: s.OperationSerializer, **error_responses(401, 403, 404)}
    )
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, pk: str | None = None) -> Response:
        reason = str(request.data.get("reason", ""))[:255] if isinstance(request.data, dict) else ""
        operation = partitioning_services.gpu_set_cordon(
            gpu_id=parse_id(pk), cordoned=True, reason=reason, requested_by=request.user
        )
        return Response(s.OperationSerializer(operation).data)

    @extend_schema(
        request=s.DrainSerializer,
        responses={202: s.OperationSerializer, **error_responses(400, 401, 403, 404, 409, 422)},
        description=(
            "Drain one GPU: cordon it, move (or stop) its replicas, and when its agent confirms "
            "it is idle apply `layout` (if given), verify it and uncordon; a failed apply rolls "
            "back to the previous layout. Progress is in the returned operation's `payload`."
        ),
    )
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str | None = None) -> Response:
        data = validated(s.DrainSerializer, request)
        raw = data.get("layout")
        layout = partitioning_services.LayoutSpec.from_json(raw) if raw else None
        operation = gpu_drain(
            gpu_id=parse_id(pk),
            layout=layout,
            timeout_s=data["timeout_s"],
            requested_by=request.user,
        )
        return Response(s.OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None,
        responses={200: s.OperationSerializer, **error_responses(401, 403, 404, 409)},
        description="Return an unhealthy or lost GPU to service (after a reset, say).",
    )
    @action(detail=True, methods=["post"])
    def heal(self, request: Request, pk: str | None = None) -> Response:
        operation = gpu_heal(gpu_id=parse_id(pk), requested_by=request.user)
        return Response(s.OperationSerializer(operation).data)

    @extend_schema(
        request=None, responses={200: s.OperationSerializer, **error_responses(401, 403, 404)}
    )
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, pk: str | None = None) -> Response:
        operation = partitioning_services.gpu_set_cordon(
            gpu_id=parse_id(pk), cordoned=False, requested_by=request.user
        )
        return Response(s.OperationSerializer(operation).data)

    @extend_schema(
        request=None,
        responses={200: s.OperationSerializer, **error_responses(401, 403, 404, 409)},
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
        return Response(s.OperationSerializer(operation).data)


@documented_reads(s.PartitionSerializer)
class PartitionViewSet(ReadViewSet[Partition]):
    """MIG instances and whole-GPU partitions (MPS-shared or dedicated)."""

    serializer_class = s.PartitionSerializer
    filterset_class = PartitionFilter
    ordering_fields = ["gpu", "start", "memory_mib"]
    queryset = Partition.objects.prefetch_related("allocations").order_by("gpu_id", "kind", "start")


@documented_reads(s.HealthEventSerializer)
class HealthEventViewSet(ReadViewSet[HealthEvent]):
    """What agents reported: Xid and ECC errors, MPS and GPU loss, workload crash loops and
    orphans stopped, hosts going offline; kept 30 days."""

    serializer_class = s.HealthEventSerializer
    filterset_class = HealthEventFilter
    ordering_fields = ["ts"]
    queryset = HealthEvent.objects.order_by("-ts", "-id")


@documented_reads(s.OperationSerializer)
class OperationViewSet(ReadViewSet[Operation]):
    """The audit trail: who asked for what, when, and how it ended. Filter by ``user``, ``kind``,
    ``status`` and time (``since``, ``until``); ``Accept: text/csv`` or ``?format=csv`` exports
    every matching row as CSV."""

    serializer_class = s.OperationSerializer
    filterset_class = OperationFilter
    ordering_fields = ["created_at", "status", "kind"]
    queryset = Operation.objects.select_related("requested_by", "deployment").order_by(
        "-created_at", "-id"
    )

    def get_renderers(self) -> list[Any]:
        renderers = super().get_renderers()
        return [*renderers, CsvRenderer()] if getattr(self, "action", None) == "list" else renderers

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        renderer = getattr(request, "accepted_renderer", None)
        if isinstance(renderer, CsvRenderer):
            return operations_csv(self.filter_queryset(self.get_queryset()))
        return super().list(request, *args, **kwargs)

    def handle_exception(self, exc: Exception) -> Response:
        # Errors are the JSON envelope, whatever format was asked for.
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = "application/json"
        return super().handle_exception(exc)


@documented_reads(s.ApiTokenSerializer)
class ApiTokenViewSet(mixins.CreateModelMixin, mixins.DestroyModelMixin, ReadViewSet[ApiToken]):
    """Your own API tokens (any role): create one for a script, list them, revoke one."""

    serializer_class = s.ApiTokenSerializer
    required_roles = {"create": Role.MEMBER, "destroy": Role.MEMBER}
    filterset_class = None
    ordering_fields = ["created_at", "name"]

    def get_queryset(self) -> QuerySet[ApiToken]:
        if getattr(self, "swagger_fake_view", False) or not self.request.user.is_authenticated:
            return ApiToken.objects.none()  # the schema generator has no user
        return ApiToken.objects.filter(user_id=self.request.user.pk).order_by("-created_at")

    @extend_schema(
        request=s.ApiTokenCreateSerializer,
        responses={201: s.ApiTokenCreatedSerializer, **error_responses(400, 401, 403, 409)},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A new token, optionally expiring; 409 ``token.limit`` past the per-user cap."""
        data = validated(s.ApiTokenCreateSerializer, request)
        token, secret = api_token_create(
            user=request.user, name=data["name"], expires_in_days=data.get("expires_in_days")
        )
        body = s.ApiTokenSerializer(token).data
        return Response({**body, "token": secret}, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, **error_responses(401, 403, 404)})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        api_token_revoke(token=self.get_object(), requested_by=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(responses={200: s.MeSerializer, **error_responses(401, 403)})
@api_view(["GET"])
def me(request: Request) -> Response:
    """The authenticated user and their role."""
    return Response({"username": request.user.get_username(), "role": role_of(request.user).label})


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
