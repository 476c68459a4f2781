"""REST API v1: read viewsets with explicit command actions. Thin: parse, call a service, render."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import Count, Model, Prefetch, QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.allocations import services as allocation_services
from fleet.allocations.drain import gpu_drain
from fleet.allocations.health import gpu_heal
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.selectors import deployment_defrag_plan, deployment_ranking
from fleet.api import serializers as s
from fleet.api.filters import (
    AllocationFilter,
    DeploymentFilter,
    GpuFilter,
    HostFilter,
    OperationFilter,
    PartitionFilter,
)
from fleet.core.models import ApiToken
from fleet.core.roles import Role, role_of
from fleet.core.services import api_token_create
from fleet.inventory import services as inventory_services
from fleet.inventory.models import Gpu, Host
from fleet.inventory.selectors import latest_telemetry_of
from fleet.mps import MpsPolicy
from fleet.partitioning import services as partitioning_services
from fleet.partitioning.models import Operation, Partition
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
    """Hosts running the agent. Admins create them and receive the one-time enrollment token."""

    serializer_class = s.HostSerializer
    filterset_class = HostFilter
    ordering_fields = ["name", "status", "last_seen_at"]
    required_roles = {"create": Role.ADMIN}

    def get_queryset(self) -> QuerySet[Host]:
        return Host.objects.annotate(gpu_count=Count("gpus")).order_by("name")

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
        request=s.LayoutSerializer,
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
        spec = _layout_spec(_valid(s.LayoutSerializer, request))
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
        layout = _layout_spec(data["layout"]) if data.get("layout") else None
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
    """Workloads. Commands: place (a drop in the UI) and evict; `auto` lets the engine place."""

    serializer_class = s.DeploymentSerializer
    filterset_class = DeploymentFilter
    ordering_fields = ["name", "created_at", "kind"]

    def get_queryset(self) -> QuerySet[Deployment]:
        return Deployment.objects.prefetch_related(
            Prefetch(
                "allocations", queryset=Allocation.objects.only("id", "replica", "deployment_id")
            )
        ).order_by("name")

    @extend_schema(
        request=s.DeploymentCreateSerializer,
        responses={201: s.DeploymentSerializer, **_errors(400, 401, 403, 409, 422)},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = _valid(s.DeploymentCreateSerializer, request)
        deployment = allocation_services.deployment_create(
            name=data["name"],
            request=allocation_services.DeploymentRequest(
                kind=data["kind"],
                profile=data.get("profile") or "",
                memory_mib=data.get("memory_mib"),
                max_compute_percent=data.get("max_compute_percent"),
                gpu_count=data.get("gpu_count"),
            ),
            replicas=data["replicas"],
            auto=data["auto"],
            requested_by=request.user,
        )
        return Response(
            s.DeploymentSerializer(self.get_queryset().get(pk=deployment.pk)).data,
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(responses={204: None, **_errors(401, 403, 404)})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        allocation_services.deployment_delete(
            deployment_id=_pk(kwargs.get("pk")), requested_by=request.user
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        responses={200: s.TargetsSerializer, **_errors(401, 403, 404)},
        description=(
            "Where the next replica fits, best first (the default fragmentation-aware strategy), "
            "and why every other target does not: the drag-and-drop preview."
        ),
    )
    @action(detail=True, methods=["get"])
    def targets(self, request: Request, pk: str | None = None) -> Response:
        deployment = self.get_object()
        ranking = deployment_ranking(deployment)
        return Response(
            {
                "deployment": deployment.pk,
                "strategy": DEFAULT_STRATEGY,
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
        responses={200: s.DefragPlanSerializer, **_errors(401, 403, 404)},
        description=(
            "A proposal, changing nothing: the fewest moves of other replicas (to GPUs where they "
            "fit, never to unhealthy or cordoned ones) after which the next replica fits. Apply it "
            "with evict/place, or drain the GPU. `target` is null when no plan of up to 3 moves "
            "exists."
        ),
    )
    @action(detail=True, methods=["get"])
    def defrag(self, request: Request, pk: str | None = None) -> Response:
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
        data = _valid(s.PlaceSerializer, request)
        operation = allocation_services.deployment_place(
            deployment_id=_pk(pk),
            partition_id=data.get("partition"),
            gpu_id=data.get("gpu"),
            requested_by=request.user,
        )
        return Response(s.OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=s.EvictSerializer,
        responses={202: s.OperationSerializer(many=True), **_errors(400, 401, 403, 404, 409)},
    )
    @action(detail=True, methods=["post"], pagination_class=None)
    def evict(self, request: Request, pk: str | None = None) -> Response:
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
    queryset = Allocation.objects.select_related("deployment", "gpu", "partition").order_by(
        "deployment_id", "replica", "gpu_slot"
    )


@documented_reads(s.OperationSerializer)
class OperationViewSet(ReadViewSet[Operation]):
    """The audit trail: who asked for what, when, and how it ended."""

    serializer_class = s.OperationSerializer
    filterset_class = OperationFilter
    ordering_fields = ["created_at", "status", "kind"]
    queryset = Operation.objects.select_related("requested_by").order_by("-created_at", "-id")


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
        responses={201: s.ApiTokenCreatedSerializer, **_errors(400, 401, 403)},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = _valid(s.ApiTokenCreateSerializer, request)
        token, secret = api_token_create(user=request.user, name=data["name"])
        body = s.ApiTokenSerializer(token).data
        return Response({**body, "token": secret}, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, **_errors(401, 403, 404)})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        self.get_object().delete()
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


def _pk(raw: Any) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        from fleet.core.errors import NotFound

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


def _layout_spec(data: dict[str, Any]) -> partitioning_services.LayoutSpec:
    return partitioning_services.LayoutSpec(
        mode=data["mode"],
        instances=tuple(
            partitioning_services.MigInstanceSpec(
                profile=_profile_ref(i["profile"]), start=i["start"], mps=_policy(i.get("mps"))
            )
            for i in data.get("instances", [])
        ),
        mps=_policy(data.get("mps")),
    )


def _profile_ref(raw: str) -> int | str:
    return int(raw) if raw.isdigit() else raw


def _policy(raw: dict[str, Any] | None) -> MpsPolicy | None:
    if raw is None:
        return None
    return MpsPolicy(
        default_active_thread_percentage=raw.get("default_active_thread_percentage", 100),
        default_pinned_mem_limit_mib=raw.get("default_pinned_mem_limit_mib"),
        max_clients=raw.get("max_clients"),
    )
