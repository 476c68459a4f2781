"""REST API v1: deployments and their replicas (allocations): create, place, move, scale,
defrag, the drag-and-drop preview, and each replica's metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.allocations import services as allocation_services
from fleet.allocations.autoplace import deployment_create_placed, deployment_place_all
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.moves import allocation_move
from fleet.allocations.quotas import quota_refusal
from fleet.allocations.scaling import deployment_update
from fleet.allocations.selectors import deployment_defrag_plan, deployment_ranking
from fleet.allocations.telemetry import replica_series
from fleet.api import serializers as s
from fleet.api import serializers_metrics as smx
from fleet.api.common import ReadViewSet, documented_reads, error_responses, parse_id, validated
from fleet.api.filters import (
    AllocationFilter,
    DeploymentFilter,
)
from fleet.api.limits import throttle_scope
from fleet.api.views_teams import (
    authorize_allocation,
    authorize_deployment,
    authorize_replica_read,
    team_for_create,
)
from fleet.core.errors import ServiceError
from fleet.core.models import OperationKind
from fleet.core.permissions import TeamRolePermission
from fleet.endpoints.services import endpoint_set
from fleet.placement import DEFAULT_STRATEGY
from fleet.workflows.defrag import deployment_defrag_apply


@documented_reads(s.DeploymentSerializer)
class DeploymentViewSet(mixins.CreateModelMixin, mixins.DestroyModelMixin, ReadViewSet[Deployment]):
    """Workloads. Commands: place (a drop in the UI), place-all (every replica that fits now)
    and evict; `auto` lets the engine place; PATCH scales or rolls out a new workload.

    Every role reads every team's deployments; what one runs (`workload`: image, command, env,
    ...) only its team's members and fleet viewers and up (others get its `runtime` only, with
    `redacted: true`). Fleet operators act on all of them, a team operator on its team's only
    (403 `auth.forbidden` on another team's)."""

    serializer_class = s.DeploymentSerializer
    filterset_class = DeploymentFilter
    ordering_fields = ["name", "created_at", "kind"]
    permission_classes = [TeamRolePermission]
    # Defragmenting moves other deployments' replicas, maybe other teams': fleet operators only.
    team_actions = frozenset({"create", "partial_update", "destroy", "place", "place_all", "evict"})

    def get_queryset(self) -> QuerySet[Deployment]:
        return (
            Deployment.objects.select_related("team", "endpoint")
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
        responses={201: s.DeploymentSerializer, **error_responses(400, 401, 403, 409, 422)},
        description=(
            "The workload must be allowed by the team's policy (`GET /teams/{id}/policy`), "
            "else 422 naming the rule: `policy.runtime_denied` (a `process` workload, unless a "
            "fleet admin allowed it), `policy.image_denied`, `policy.user_denied` (root, or a "
            "uid outside the allowed ranges), `policy.host_memory_denied`. Nothing is created."
        ),
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = validated(s.DeploymentCreateSerializer, request)
        team_id = team_for_create(request.user, data.get("team"))
        create = deployment_create_placed if data["auto"] else allocation_services.deployment_create
        with transaction.atomic():  # an endpoint refused: no deployment either
            deployment = self._create(create, data, team_id, request)
            if data.get("endpoint") is not None:
                endpoint_set(
                    deployment_id=deployment.pk,
                    spec=dict(request.data["endpoint"]),
                    requested_by=request.user,
                )
        return Response(
            s.DeploymentSerializer(self.get_queryset().get(pk=deployment.pk)).data,
            status=status.HTTP_201_CREATED,
        )

    def _create(self, create: Any, data: dict[str, Any], team_id: int, request: Request) -> Any:
        return create(
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
            host_memory_mib=data.get("host_memory_mib"),
            requested_by=request.user,
        )

    @extend_schema(
        request=s.DeploymentUpdateSerializer,
        responses={
            200: s.DeploymentSerializer,
            202: s.OperationSerializer,
            **error_responses(400, 401, 403, 404, 409, 422),
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
            'being deleted is a 409. `{"team": "search"}` hands the deployment to another team '
            "(id or slug; you must operate both, and its quota must hold the replicas in place, "
            "else 422 `quota.exceeded`): its replicas stay put, usage is billed to the new team "
            "from then on; answered 200 with the deployment. A new workload, and a deployment "
            "handed to another team, must be allowed by the (new) team's policy, else 422 "
            "`policy.*` as on create."
        ),
    )
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if not isinstance(request.data, Mapping):
            raise ServiceError("malformed_request", "The body must be a JSON object.")
        deployment_id = parse_id(kwargs.get("pk"))
        authorize_deployment(request.user, deployment_id)
        changes = dict(request.data)
        if "team" in changes:  # the team it goes to: the user must operate that one too
            named = changes["team"]
            if not isinstance(named, str | int) or isinstance(named, bool):
                raise ServiceError("team.not_found", "'team' is a team's id or slug.")
            changes["team"] = team_for_create(request.user, str(named)[:64])
        with transaction.atomic():  # the endpoint and the rest, or neither
            if "endpoint" in changes:
                endpoint_set(
                    deployment_id=deployment_id,
                    spec=changes.pop("endpoint"),
                    requested_by=request.user,
                )
            operation = (
                deployment_update(
                    deployment_id=deployment_id, changes=changes, requested_by=request.user
                )
                if changes or "endpoint" not in request.data
                else None
            )
        if operation is not None and operation.kind == OperationKind.ROLLOUT:
            return Response(s.OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)
        return Response(s.DeploymentSerializer(self.get_queryset().get(pk=deployment_id)).data)

    @extend_schema(responses={204: None, **error_responses(401, 403, 404)})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        authorize_deployment(request.user, parse_id(kwargs.get("pk")))
        allocation_services.deployment_delete(
            deployment_id=parse_id(kwargs.get("pk")), requested_by=request.user
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        responses={200: s.TargetsSerializer, **error_responses(401, 403, 404)},
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
        responses={200: s.DefragPlanSerializer, **error_responses(401, 403, 404)},
        description=(
            "A proposal, changing nothing: the fewest moves of other replicas (to GPUs where they "
            "fit, never to unhealthy or cordoned ones) after which the next replica fits. `POST` "
            "applies it. `target` is null when no plan of up to 3 moves exists."
        ),
    )
    @extend_schema(
        methods=["POST"],
        request=None,
        responses={202: s.OperationSerializer, **error_responses(401, 403, 404, 409)},
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
            operation = deployment_defrag_apply(
                deployment_id=parse_id(pk), requested_by=request.user
            )
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
        responses={202: s.OperationSerializer, **error_responses(400, 401, 403, 404, 409, 422)},
    )
    @action(detail=True, methods=["post"])
    def place(self, request: Request, pk: str | None = None) -> Response:
        authorize_deployment(request.user, parse_id(pk))
        data = validated(s.PlaceSerializer, request)
        operation = allocation_services.deployment_place(
            deployment_id=parse_id(pk),
            partition_id=data.get("partition"),
            gpu_id=data.get("gpu"),
            requested_by=request.user,
        )
        return Response(s.OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None,
        responses={202: s.PlaceAllSerializer, **error_responses(401, 403, 404, 409)},
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
        authorize_deployment(request.user, parse_id(pk))
        result = deployment_place_all(deployment_id=parse_id(pk), requested_by=request.user)
        body = {
            "deployment": parse_id(pk),
            "placed": s.OperationSerializer(result.operations, many=True).data,
            "unplaced": result.unplaced,
            "reasons": [v.as_dict() for v in result.reasons],
        }
        return Response(body, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=s.EvictSerializer,
        responses={
            202: s.OperationSerializer(many=True),
            **error_responses(400, 401, 403, 404, 409),
        },
    )
    @action(detail=True, methods=["post"], pagination_class=None)
    def evict(self, request: Request, pk: str | None = None) -> Response:
        authorize_deployment(request.user, parse_id(pk))
        data = validated(s.EvictSerializer, request)
        operations = allocation_services.deployment_evict(
            deployment_id=parse_id(pk), replica=data.get("replica"), requested_by=request.user
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
    queryset = Allocation.objects.select_related("deployment", "gpu__host", "partition").order_by(
        "deployment_id", "replica", "gpu_slot"
    )

    @extend_schema(
        parameters=[smx.ReplicaMetricsQuerySerializer],
        responses={200: smx.ReplicaMetricsSerializer, **error_responses(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        """The replica's utilisation and memory over a window (its team's members and fleet
        viewers and up; 403 `auth.forbidden` for another team's member): its MIG instance's,
        or its processes' memory (MPS), or its GPU's utilisation and its processes' memory
        (whole GPU). `null` where there is no value, never 0."""
        query = smx.ReplicaMetricsQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        allocation = self.get_object()
        authorize_replica_read(request.user, allocation.pk)
        return Response(replica_series(allocation, window=query.validated_data["window"]))

    @extend_schema(
        request=s.MoveRequestSerializer,
        responses={202: s.OperationSerializer, **error_responses(400, 401, 403, 404, 409, 422)},
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
        data = validated(s.MoveRequestSerializer, request)
        operation = allocation_move(
            allocation_id=parse_id(pk),
            partition_id=data.get("partition"),
            gpu_id=data.get("gpu"),
            start=data.get("start"),
            timeout_s=data.get("timeout_s"),
            requested_by=request.user,
        )
        return Response(s.OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)


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
