"""REST API v1: read viewsets with explicit command actions. Thin: parse, call a service, render."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from django.db.models import Count, Model, Prefetch, QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.allocations import services as allocation_services
from fleet.allocations.autoplace import deployment_create_placed, deployment_place_all
from fleet.allocations.defrag import deployment_defrag_apply
from fleet.allocations.drain import gpu_drain
from fleet.allocations.health import gpu_heal
from fleet.allocations.maintenance import host_cordon, host_drain, host_uncordon, scheduled_drains
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.moves import allocation_move
from fleet.allocations.quotas import quota_refusal
from fleet.allocations.scaling import deployment_update
from fleet.allocations.selectors import deployment_defrag_plan, deployment_ranking
from fleet.allocations.telemetry import replica_series
from fleet.api import serializers as s
from fleet.api import serializers_metrics as smx
from fleet.api import serializers_mig as sm
from fleet.api.export import CsvRenderer, operations_csv
from fleet.api.filters import (
    AllocationFilter,
    DeploymentFilter,
    HealthEventFilter,
    HostFilter,
    PartitionFilter,
)
from fleet.api.limits import throttle_scope
from fleet.api.views_teams import authorize_allocation, authorize_deployment, team_for_create
from fleet.core.errors import NotFound, ServiceError
from fleet.core.filters import OperationFilter
from fleet.core.models import ApiToken, Operation, OperationKind
from fleet.core.permissions import TeamRolePermission
from fleet.core.roles import Role, role_of
from fleet.core.services import api_token_create, api_token_revoke
from fleet.inventory import services as inventory_services
from fleet.inventory.filters import GpuFilter
from fleet.inventory.models import Gpu, HealthEvent, Host
from fleet.inventory.selectors import HISTORY_WINDOWS, gpu_history_series, latest_telemetry_of
from fleet.inventory.telemetry import METRICS
from fleet.partitioning import services as partitioning_services
from fleet.partitioning.models import Partition
from fleet.placement import DEFAULT_STRATEGY

_M = TypeVar("_M", bound=Model)

ERRORS = {
    400: OpenApiResponse(s.ErrorSerializer, description="Malformed or invalid input"),
    401: OpenApiResponse(s.ErrorSerializer, description="Not authenticated"),
    403: OpenApiResponse(s.ErrorSerializer, description="Role too low"),
    404: OpenApiResponse(s.ErrorSerializer, description="Not found"),
    409: OpenApiResponse(s.ErrorSerializer, description="Conflicts with the current state"),
    422: OpenApiResponse(s.ErrorSerializer, description="Refused by the MIG/MPS/placement rules"),
}
READ_ERRORS = {k: ERRORS[k] for k in (400, 401, 403, 404)}


def _errors(*codes: int) -> dict[int, OpenApiResponse]:
    return {code: ERRORS[code] for code in codes}


def documented_reads(serializer: type[Any]) -> Any:
    """The OpenAPI responses of a read viewset's list and retrieve."""
    return extend_schema_view(
        list=extend_schema(responses={200: serializer(many=True), **READ_ERRORS}),
        retrieve=extend_schema(responses={200: serializer, **READ_ERRORS}),
    )


class ReadViewSet(viewsets.ReadOnlyModelViewSet[_M]):
    """List and retrieve by numeric id (any other id is a 404 envelope, not a route miss)."""

    lookup_value_regex = r"[0-9]+"


@documented_reads(s.HostSerializer)
class HostViewSet(mixins.CreateModelMixin, ReadViewSet[Host]):
    """Hosts running the agent. Admins create them and receive the one-time enrollment token;
    operators edit labels (PATCH) and cordon, uncordon and drain them."""

    serializer_class = s.HostSerializer
    filterset_class = HostFilter
    ordering_fields = ["name", "status", "last_seen_at"]
    required_roles = {"create": Role.ADMIN, "revoke_token": Role.ADMIN}
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self) -> QuerySet[Host]:
        return Host.objects.annotate(gpu_count=Count("gpus")).order_by("name")

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
        responses={200: s.HostSerializer, **_errors(400, 401, 403, 404)},
        description=(
            'Replace the host\'s labels: `{"labels": {"zone": "a"}}` (operators and admins). At '
            "most 32 labels; keys like Kubernetes label keys (an optional `prefix/`, then "
            "letters, digits, `-`, `_`, `.`), at most 63 characters; values at most 63 printable "
            "characters. Placed replicas stay; deployments that require labels (`host_labels`) "
            "are placed only on hosts carrying them. Any other field is a 400."
        ),
    )
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        host_id = _pk(kwargs.get("pk"))
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
        responses={200: s.HostSerializer, **_errors(401, 403, 404, 409)},
        description=(
            "Cordon a ready host: it keeps what it runs and takes no new replica (the placement "
            "engine refuses it with `placement.cordoned`). 409 `host.not_ready` for an offline "
            "or unhealthy host, `host.held` for one draining or in maintenance."
        ),
    )
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, pk: str | None = None) -> Response:
        host_cordon(host_id=_pk(pk), requested_by=request.user)
        return Response(self._host(_pk(pk)))

    @extend_schema(
        request=None,
        responses={200: s.HostSerializer, **_errors(401, 403, 404, 409)},
        description=(
            "Return a cordoned, draining or maintenance host to service (`ready`) and cancel "
            "its drain, scheduled or running (the replicas already moved stay where they went). "
            "On a ready host with a scheduled drain it only cancels the drain; 409 "
            "`host.not_cordoned` when there is nothing to undo."
        ),
    )
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, pk: str | None = None) -> Response:
        host_uncordon(host_id=_pk(pk), requested_by=request.user)
        return Response(self._host(_pk(pk)))

    @extend_schema(
        request=s.HostDrainSerializer,
        responses={202: s.OperationSerializer, **_errors(400, 401, 403, 404, 409)},
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
        data = _valid(s.HostDrainSerializer, request)
        operation = host_drain(
            host_id=_pk(pk),
            at=data.get("at"),
            force=data["force"],
            timeout_s=data["timeout_s"],
            requested_by=request.user,
        )
        return Response(s.OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: s.HostSerializer, **_errors(401, 403, 404)})
    @action(detail=True, methods=["post"], url_path="revoke-token")
    def revoke_token(self, request: Request, pk: str | None = None) -> Response:
        """Revoke the host's agent token: its requests are refused and its open sockets closed
        at once. The agent needs a new enrollment token (`POST /hosts/` or the admin) after."""
        host = self.get_object()
        inventory_services.host_revoke_token(host_id=host.pk, requested_by=request.user)
        return Response(s.HostSerializer(self.get_queryset().get(pk=host.pk)).data)

    @extend_schema(
        request=s.HostCreateSerializer,
        responses={201: s.HostCreatedSerializer, **_errors(400, 401, 403, 409)},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = _valid(s.HostCreateSerializer, request)
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
        responses={200: smx.GpuHistorySerializer, **_errors(400, 401, 403, 404)},
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
            **_errors(400, 401, 403, 404, 409, 422),
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
        spec = partitioning_services.LayoutSpec.from_json(_valid(sm.LayoutSerializer, request))
        operation = partitioning_services.gpu_set_layout(
            gpu_id=_pk(pk), spec=spec, requested_by=request.user
        )
        code = status.HTTP_200_OK if operation.status == "succeeded" else status.HTTP_202_ACCEPTED
        return Response(s.OperationSerializer(operation).data, status=code)

    @extend_schema(request=None, responses={200: s.OperationSerializer, **_errors(401, 403, 404)})
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, pk: str | None = None) -> Response:
        reason = str(request.data.get("reason", ""))[:255] if isinstance(request.data, dict) else ""
        operation = partitioning_services.gpu_set_cordon(
            gpu_id=_pk(pk), cordoned=True, reason=reason, requested_by=request.user
        )
        return Response(s.OperationSerializer(operation).data)

    @extend_schema(
        request=s.DrainSerializer,
        responses={202: s.OperationSerializer, **_errors(400, 401, 403, 404, 409, 422)},
        description=(
            "Drain one GPU: cordon it, move (or stop) its replicas, and when its agent confirms "
            "it is idle apply `layout` (if given), verify it and uncordon; a failed apply rolls "
            "back to the previous layout. Progress is in the returned operation's `payload`."
        ),
    )
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str | None = None) -> Response:
        data = _valid(s.DrainSerializer, request)
        raw = data.get("layout")
        layout = partitioning_services.LayoutSpec.from_json(raw) if raw else None
        operation = gpu_drain(
            gpu_id=_pk(pk), layout=layout, timeout_s=data["timeout_s"], requested_by=request.user
        )
        return Response(s.OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None,
        responses={200: s.OperationSerializer, **_errors(401, 403, 404, 409)},
        description="Return an unhealthy or lost GPU to service (after a reset, say).",
    )
    @action(detail=True, methods=["post"])
    def heal(self, request: Request, pk: str | None = None) -> Response:
        operation = gpu_heal(gpu_id=_pk(pk), requested_by=request.user)
        return Response(s.OperationSerializer(operation).data)

    @extend_schema(request=None, responses={200: s.OperationSerializer, **_errors(401, 403, 404)})
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, pk: str | None = None) -> Response:
        operation = partitioning_services.gpu_set_cordon(
            gpu_id=_pk(pk), cordoned=False, requested_by=request.user
        )
        return Response(s.OperationSerializer(operation).data)


@documented_reads(s.PartitionSerializer)
class PartitionViewSet(ReadViewSet[Partition]):
    """MIG instances and whole-GPU partitions (MPS-shared or dedicated)."""

    serializer_class = s.PartitionSerializer
    filterset_class = PartitionFilter
    ordering_fields = ["gpu", "start", "memory_mib"]
    queryset = Partition.objects.prefetch_related("allocations").order_by("gpu_id", "kind", "start")


@documented_reads(s.DeploymentSerializer)
class DeploymentViewSet(mixins.CreateModelMixin, mixins.DestroyModelMixin, ReadViewSet[Deployment]):
    """Workloads. Commands: place (a drop in the UI), place-all (every replica that fits now)
    and evict; `auto` lets the engine place; PATCH scales or rolls out a new workload.

    Every role reads every team's deployments; fleet operators act on all of them, a team
    operator on its team's only (403 `auth.forbidden` on another team's)."""

    serializer_class = s.DeploymentSerializer
    filterset_class = DeploymentFilter
    ordering_fields = ["name", "created_at", "kind"]
    permission_classes = [TeamRolePermission]
    # Defragmenting moves other deployments' replicas, maybe other teams': fleet operators only.
    team_actions = frozenset({"create", "partial_update", "destroy", "place", "place_all", "evict"})

    def get_queryset(self) -> QuerySet[Deployment]:
        return (
            Deployment.objects.select_related("team")
            .prefetch_related(
                Prefetch(
                    "allocations",
                    queryset=Allocation.objects.only(
                        "id", "replica", "deployment_id", "state", "workload_state"
                    ),
                )
            )
            .order_by("name")
        )

    @extend_schema(
        request=s.DeploymentCreateSerializer,
        responses={201: s.DeploymentSerializer, **_errors(400, 401, 403, 409, 422)},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = _valid(s.DeploymentCreateSerializer, request)
        team_id = team_for_create(request.user, data.get("team"))
        create = deployment_create_placed if data["auto"] else allocation_services.deployment_create
        deployment = create(
            name=data["name"],
            request=allocation_services.DeploymentRequest(
                kind=data["kind"],
                profile=data.get("profile") or "",
                memory_mib=data.get("memory_mib"),
                max_compute_percent=data.get("max_compute_percent"),
                gpu_count=data.get("gpu_count"),
            ),
            replicas=data["replicas"],
            workload=data.get("workload"),
            host_labels=data.get("host_labels"),
            team_id=team_id,
            requested_by=request.user,
        )
        return Response(
            s.DeploymentSerializer(self.get_queryset().get(pk=deployment.pk)).data,
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(
        request=s.DeploymentUpdateSerializer,
        responses={
            200: s.DeploymentSerializer,
            202: s.OperationSerializer,
            **_errors(400, 401, 403, 404, 409, 422),
        },
        description=(
            'Scale: `{"replicas": n}` (1..1000), the only field that can change. New replicas '
            "wait to be placed, or are placed by the engine at once (all or none, else 422) when "
            "the deployment is `auto_place`; scaling down stops the newest replicas (highest "
            "index) first, through eviction (a running workload's slice stays `releasing` until "
            "it has stopped). Answers 200 with the deployment. "
            '`{"workload": {...}, "rollout": {"max_surge": 1, "max_unavailable": 0}}`: a rolling '
            "update, answered 202 with the `rollout` operation (follow it): each replica gets a "
            "new copy with the new workload, which runs before the old copy stops; a new copy "
            "that fails stops the rollout and rolls the updated replicas back. One change at a "
            "time (`deployment.one_change`); a rollout in progress is a 409. Any other field is "
            "a 400 (`deployment.field_immutable`, `deployment.field_unknown`); a deployment "
            "being deleted is a 409."
        ),
    )
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if not isinstance(request.data, Mapping):
            raise ServiceError("malformed_request", "The body must be a JSON object.")
        deployment_id = _pk(kwargs.get("pk"))
        authorize_deployment(request.user, deployment_id)
        operation = deployment_update(
            deployment_id=deployment_id, changes=request.data, requested_by=request.user
        )
        if operation is not None and operation.kind == OperationKind.ROLLOUT:
            return Response(s.OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)
        return Response(s.DeploymentSerializer(self.get_queryset().get(pk=deployment_id)).data)

    @extend_schema(responses={204: None, **_errors(401, 403, 404)})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        authorize_deployment(request.user, _pk(kwargs.get("pk")))
        allocation_services.deployment_delete(
            deployment_id=_pk(kwargs.get("pk")), requested_by=request.user
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        responses={200: s.TargetsSerializer, **_errors(401, 403, 404)},
        description=(
            "Where the next replica fits, best first (the default fragmentation-aware strategy), "
            "and why every other target does not: the drag-and-drop preview. `quota`: the "
            "team's limits the next replica would pass (`quota.exceeded`, each naming the limit, "
            "what is in use and what is asked); when not empty, every drop is refused (422) "
            "whatever `feasible` says."
        ),
    )
    @action(detail=True, methods=["get"])
    @throttle_scope("expensive")  # ranks every GPU of the fleet
    def targets(self, request: Request, pk: str | None = None) -> Response:
        deployment = self.get_object()
        ranking = deployment_ranking(deployment)
        return Response(
            {
                "deployment": deployment.pk,
                "strategy": DEFAULT_STRATEGY,
                "quota": [v.as_dict() for v in quota_refusal(deployment)],
                "feasible": [_target(t) for t in ranking.feasible],
                "infeasible": [
                    {
                        "gpu": r.gpu_id,
                        "partition": r.partition_id,
                        "violations": [v.as_dict() for v in r.violations],
                    }
                    for r in ranking.infeasible
                ],
            }
        )

    @extend_schema(
        methods=["GET"],
        responses={200: s.DefragPlanSerializer, **_errors(401, 403, 404)},
        description=(
            "A proposal, changing nothing: the fewest moves of other replicas (to GPUs where they "
            "fit, never to unhealthy or cordoned ones) after which the next replica fits. `POST` "
            "applies it. `target` is null when no plan of up to 3 moves exists."
        ),
    )
    @extend_schema(
        methods=["POST"],
        request=None,
        responses={202: s.OperationSerializer, **_errors(401, 403, 404, 409)},
        description=(
            "Apply the proposal (fleet operator: it moves other deployments' replicas, whatever "
            "their team): each move make before break (a MIG replica's old "
            "slice is destroyed once it has stopped), idle slices in the way destroyed, then the "
            "next replica placed; one `defrag` operation shows each step. A move that fails "
            "stops it, its replica still running where it was. 409: `defrag.fits_now` (place "
            "it), `defrag.no_plan`, `defrag.in_progress`, `deployment.fully_placed`."
        ),
    )
    @action(detail=True, methods=["get", "post"])
    @throttle_scope("expensive")  # searches moves across the fleet
    def defrag(self, request: Request, pk: str | None = None) -> Response:
        if request.method == "POST":
            operation = deployment_defrag_apply(deployment_id=_pk(pk), requested_by=request.user)
            return Response(s.OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)
        deployment = self.get_object()
        plan = deployment_defrag_plan(deployment)
        target = plan.target
        return Response(
            {
                "deployment": deployment.pk,
                "fits_now": target is not None and not plan.moves,
                "moves": [_move(m) for m in plan.moves],
                "target": _target(target) if target is not None else None,
            }
        )

    @extend_schema(
        request=s.PlaceSerializer,
        responses={202: s.OperationSerializer, **_errors(400, 401, 403, 404, 409, 422)},
    )
    @action(detail=True, methods=["post"])
    def place(self, request: Request, pk: str | None = None) -> Response:
        authorize_deployment(request.user, _pk(pk))
        data = _valid(s.PlaceSerializer, request)
        operation = allocation_services.deployment_place(
            deployment_id=_pk(pk),
            partition_id=data.get("partition"),
            gpu_id=data.get("gpu"),
            requested_by=request.user,
        )
        return Response(s.OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None,
        responses={202: s.PlaceAllSerializer, **_errors(401, 403, 404, 409)},
        description=(
            "Place every unplaced replica that fits now, one after another on the engine's best "
            "target (auto-placement), keeping those placed when a later one fits nowhere. "
            "`placed`: the place operations; `unplaced` and `reasons`: what is left and why (the "
            "main refusals, each with how many GPUs gave it). 409 `place_all.nothing_fits` when "
            "not one replica fits (the reasons in `details.violations`), "
            "`deployment.fully_placed` when nothing is left to place."
        ),
    )
    @action(detail=True, methods=["post"], url_path="place-all")
    @throttle_scope("expensive")  # ranks the fleet once per replica
    def place_all(self, request: Request, pk: str | None = None) -> Response:
        authorize_deployment(request.user, _pk(pk))
        result = deployment_place_all(deployment_id=_pk(pk), requested_by=request.user)
        body = {
            "deployment": _pk(pk),
            "placed": s.OperationSerializer(result.operations, many=True).data,
            "unplaced": result.unplaced,
            "reasons": [v.as_dict() for v in result.reasons],
        }
        return Response(body, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=s.EvictSerializer,
        responses={202: s.OperationSerializer(many=True), **_errors(400, 401, 403, 404, 409)},
    )
    @action(detail=True, methods=["post"], pagination_class=None)
    def evict(self, request: Request, pk: str | None = None) -> Response:
        authorize_deployment(request.user, _pk(pk))
        data = _valid(s.EvictSerializer, request)
        operations = allocation_services.deployment_evict(
            deployment_id=_pk(pk), replica=data.get("replica"), requested_by=request.user
        )
        return Response(
            s.OperationSerializer(operations, many=True).data, status=status.HTTP_202_ACCEPTED
        )


@documented_reads(s.AllocationSerializer)
class AllocationViewSet(ReadViewSet[Allocation]):
    """Replicas bound to partitions. Capacity is counted from these reservations."""

    serializer_class = s.AllocationSerializer
    filterset_class = AllocationFilter
    ordering_fields = ["created_at", "deployment", "gpu"]
    permission_classes = [TeamRolePermission]
    team_actions = frozenset({"move"})
    queryset = Allocation.objects.select_related("deployment", "gpu", "partition").order_by(
        "deployment_id", "replica", "gpu_slot"
    )

    @extend_schema(
        parameters=[smx.ReplicaMetricsQuerySerializer],
        responses={200: smx.ReplicaMetricsSerializer, **_errors(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        """The replica's utilisation and memory over a window (any role): its MIG instance's,
        or its processes' memory (MPS), or its GPU's utilisation and its processes' memory
        (whole GPU). `null` where there is no value, never 0."""
        query = smx.ReplicaMetricsQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        allocation = self.get_object()
        return Response(replica_series(allocation, window=query.validated_data["window"]))

    @extend_schema(
        request=s.MoveRequestSerializer,
        responses={202: s.OperationSerializer, **_errors(400, 401, 403, 404, 409, 422)},
    )
    @action(detail=True, methods=["post"])
    def move(self, request: Request, pk: str | None = None) -> Response:
        """Move one replica, make before break: the new copy starts on the target and the old
        one stops only once it runs; a failure leaves the old copy running. The ``move``
        operation shows each step. The team's quota is not asked: the new copy counts in place
        of the old one."""
        authorize_allocation(request.user, _pk(pk))
        data = _valid(s.MoveRequestSerializer, request)
        operation = allocation_move(
            allocation_id=_pk(pk),
            partition_id=data.get("partition"),
            gpu_id=data.get("gpu"),
            start=data.get("start"),
            timeout_s=data.get("timeout_s"),
            requested_by=request.user,
        )
        return Response(s.OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)


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
    queryset = Operation.objects.select_related("requested_by").order_by("-created_at", "-id")

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
    required_roles = {"create": Role.VIEWER, "destroy": Role.VIEWER}
    filterset_class = None
    ordering_fields = ["created_at", "name"]

    def get_queryset(self) -> QuerySet[ApiToken]:
        if getattr(self, "swagger_fake_view", False) or not self.request.user.is_authenticated:
            return ApiToken.objects.none()  # the schema generator has no user
        return ApiToken.objects.filter(user_id=self.request.user.pk).order_by("-created_at")

    @extend_schema(
        request=s.ApiTokenCreateSerializer,
        responses={201: s.ApiTokenCreatedSerializer, **_errors(400, 401, 403, 409)},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A new token, optionally expiring; 409 ``token.limit`` past the per-user cap."""
        data = _valid(s.ApiTokenCreateSerializer, request)
        token, secret = api_token_create(
            user=request.user, name=data["name"], expires_in_days=data.get("expires_in_days")
        )
        body = s.ApiTokenSerializer(token).data
        return Response({**body, "token": secret}, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, **_errors(401, 403, 404)})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        api_token_revoke(token=self.get_object(), requested_by=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(responses={200: s.MeSerializer, **_errors(401, 403)})
@api_view(["GET"])
def me(request: Request) -> Response:
    """The authenticated user and their role."""
    return Response({"username": request.user.get_username(), "role": role_of(request.user).label})


def _valid(serializer_class: type[Any], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _pk(raw: Any) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise NotFound("not_found", f"No object with id {raw!r}.") from None
    return value


def _instance(instance: Any) -> dict[str, int] | None:
    return {"profile_id": instance.profile_id, "start": instance.start} if instance else None


def _target(target: Any) -> dict[str, Any]:
    return {
        "gpu": target.gpu_id,
        "partition": target.partition_id,
        "gpus": list(target.gpu_ids or (target.gpu_id,)),
        "score": target.score,
        "new_instance": _instance(target.new_instance),
    }


def _move(move: Any) -> dict[str, Any]:
    mig = move.kind == "mig"
    allocation = None
    if move.occupied:
        allocation = (
            Allocation.objects.filter(partition_id=move.allocation_id)
            .values_list("pk", flat=True)
            .first()
            if mig
            else move.allocation_id
        )
    return {
        "kind": move.kind,
        "allocation": allocation,
        "partition": move.allocation_id if mig else None,
        "from_gpu": move.from_gpu,
        "to_gpu": move.to_gpu,
        "to_partition": move.to_partition_id,
        "new_instance": _instance(move.new_instance),
    }
