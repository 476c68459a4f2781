"""The placement commands of ``/deployments/{id}/``: the drag-and-drop preview (``targets``),
defragmentation (``defrag``), ``place``, ``place-all`` and ``evict``. Each answer is rendered
through the serializer its OpenAPI schema names."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.viewsets import GenericViewSet

from fleet.allocations import services as allocation_services
from fleet.allocations.autoplace import deployment_place_all
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.quotas import quota_refusal
from fleet.allocations.rankings import deployment_defrag_plan, deployment_ranking
from fleet.api.common import error_responses, parse_id, validated
from fleet.api.limits import throttle_scope
from fleet.api.permissions import authorize_deployment
from fleet.api.resources.operations.serializers import OperationSerializer
from fleet.api.resources.placement.serializers import (
    DefragPlanSerializer,
    EvictSerializer,
    PlaceAllSerializer,
    PlaceSerializer,
    TargetsSerializer,
)
from fleet.placement import DEFAULT_STRATEGY
from fleet.workflows.defrag import deployment_defrag_apply


class DeploymentPlacementActions(GenericViewSet[Deployment]):
    """The placement actions of :class:`~fleet.api.resources.deployments.views.DeploymentViewSet`
    (a mixin: the viewset gives the queryset, the filters and the team permission)."""

    @extend_schema(
        responses={200: TargetsSerializer, **error_responses(401, 403, 404)},
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
        body = {
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
        return Response(TargetsSerializer(body).data)

    @extend_schema(
        methods=["GET"],
        responses={200: DefragPlanSerializer, **error_responses(401, 403, 404)},
        description=(
            "A proposal, changing nothing: the fewest moves of other replicas (to GPUs where they "
            "fit, never to unhealthy or cordoned ones) after which the next replica fits. `POST` "
            "applies it. `target` is null when no plan of up to 3 moves exists."
        ),
    )
    @extend_schema(
        methods=["POST"],
        request=None,
        responses={202: OperationSerializer, **error_responses(401, 403, 404, 409)},
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
            return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)
        deployment = self.get_object()
        plan = deployment_defrag_plan(deployment)
        target = plan.target
        body = {
            "deployment": deployment.pk,
            "fits_now": target is not None and not plan.moves,
            "moves": [_move(m) for m in plan.moves],
            "target": _target(target) if target is not None else None,
        }
        return Response(DefragPlanSerializer(body).data)

    @extend_schema(
        request=PlaceSerializer,
        responses={202: OperationSerializer, **error_responses(400, 401, 403, 404, 409, 422)},
    )
    @action(detail=True, methods=["post"])
    def place(self, request: Request, pk: str | None = None) -> Response:
        authorize_deployment(request.user, parse_id(pk))
        data = validated(PlaceSerializer, request)
        operation = allocation_services.deployment_place(
            deployment_id=parse_id(pk),
            partition_id=data.get("partition"),
            gpu_id=data.get("gpu"),
            requested_by=request.user,
        )
        return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None,
        responses={202: PlaceAllSerializer, **error_responses(401, 403, 404, 409)},
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
            "placed": result.operations,
            "unplaced": result.unplaced,
            "reasons": [v.as_dict() for v in result.reasons],
        }
        return Response(
            PlaceAllSerializer(body, context=self.get_serializer_context()).data,
            status=status.HTTP_202_ACCEPTED,
        )

    @extend_schema(
        request=EvictSerializer,
        description=(
            "Stop the deployment's replicas (or one, `replica`) and free their slices; the "
            "deployment stays, its replicas unplaced. Those of an `auto_place` deployment wait "
            "in the queue, which places them again as capacity allows: scale it down (PATCH "
            "`replicas`) or delete it to stop them for good."
        ),
        responses={
            202: OperationSerializer(many=True),
            **error_responses(400, 401, 403, 404, 409),
        },
    )
    @action(detail=True, methods=["post"], pagination_class=None)
    def evict(self, request: Request, pk: str | None = None) -> Response:
        authorize_deployment(request.user, parse_id(pk))
        data = validated(EvictSerializer, request)
        operations = allocation_services.deployment_evict(
            deployment_id=parse_id(pk), replica=data.get("replica"), requested_by=request.user
        )
        return Response(
            OperationSerializer(operations, many=True).data, status=status.HTTP_202_ACCEPTED
        )


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
