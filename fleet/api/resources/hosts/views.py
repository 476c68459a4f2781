"""``/hosts/``: hosts running the agent; create (admins), labels, cordon, drain, reservation and
token commands."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import Count, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.agents.host_tokens import host_token_rotate
from fleet.allocations.maintenance import host_cordon, host_drain, host_uncordon, scheduled_drains
from fleet.api.common import ReadViewSet, documented_reads, error_responses, parse_id, validated
from fleet.api.filters import HostFilter
from fleet.api.resources.hosts.serializers import (
    HostCreatedSerializer,
    HostCreateSerializer,
    HostDrainSerializer,
    HostReservationSerializer,
    HostRotateTokenQuerySerializer,
    HostSerializer,
    HostTokenRotatedSerializer,
    HostUpdateSerializer,
)
from fleet.api.resources.operations.serializers import OperationSerializer
from fleet.core.errors import ServiceError
from fleet.core.roles import Role
from fleet.inventory import services as inventory_services
from fleet.inventory.models import Host
from fleet.inventory.reservations import host_set_reservation


@documented_reads(HostSerializer)
class HostViewSet(mixins.CreateModelMixin, ReadViewSet[Host]):
    """Hosts running the agent. Admins create them and receive the one-time enrollment token,
    and reserve them for teams; operators edit labels (PATCH) and cordon, uncordon and drain
    them."""

    serializer_class = HostSerializer
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
        request=HostUpdateSerializer,
        responses={200: HostSerializer, **error_responses(400, 401, 403, 404)},
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
        responses={200: HostSerializer, **error_responses(401, 403, 404, 409)},
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
        responses={200: HostSerializer, **error_responses(401, 403, 404, 409)},
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
        request=HostDrainSerializer,
        responses={202: OperationSerializer, **error_responses(400, 401, 403, 404, 409)},
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
        data = validated(HostDrainSerializer, request)
        operation = host_drain(
            host_id=parse_id(pk),
            at=data.get("at"),
            force=data["force"],
            timeout_s=data["timeout_s"],
            requested_by=request.user,
        )
        return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=HostReservationSerializer,
        responses={200: HostSerializer, **error_responses(400, 401, 403, 404)},
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
        data = validated(HostReservationSerializer, request)
        host_set_reservation(host_id=parse_id(pk), teams=data["teams"], requested_by=request.user)
        return Response(self._host(parse_id(pk)))

    @extend_schema(request=None, responses={200: HostSerializer, **error_responses(401, 403, 404)})
    @action(detail=True, methods=["post"], url_path="revoke-token")
    def revoke_token(self, request: Request, pk: str | None = None) -> Response:
        """Revoke the host's agent token: its requests are refused and its open sockets closed
        at once. The agent needs a new enrollment token (`POST /hosts/` or the admin) after."""
        host = self.get_object()
        inventory_services.host_revoke_token(host_id=host.pk, requested_by=request.user)
        return Response(HostSerializer(self.get_queryset().get(pk=host.pk)).data)

    @extend_schema(
        request=None,
        parameters=[HostRotateTokenQuerySerializer],
        responses={200: HostTokenRotatedSerializer, **error_responses(400, 401, 403, 404)},
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
        query = HostRotateTokenQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        host = self.get_object()
        _, token = host_token_rotate(
            host_id=host.pk, revoke=query.validated_data["revoke"], requested_by=request.user
        )
        body = HostTokenRotatedSerializer(self.get_queryset().get(pk=host.pk)).data
        return Response({**body, "token": token})

    @extend_schema(
        request=HostCreateSerializer,
        responses={201: HostCreatedSerializer, **error_responses(400, 401, 403, 409)},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = validated(HostCreateSerializer, request)
        host, token = inventory_services.host_create(
            name=data["name"], labels=data.get("labels", {}), requested_by=request.user
        )
        body = HostCreatedSerializer(self.get_queryset().get(pk=host.pk)).data
        return Response({**body, "enrollment_token": token}, status=status.HTTP_201_CREATED)
