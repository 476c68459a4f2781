"""``GET /capacity/``: what fits now, and what is stranded; ``/capacity/repack``: empty GPUs;
``GET /capacity/advice``: the layout advisor's rollout proposal."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.allocations import advice
from fleet.allocations.capacity import fleet_capacity
from fleet.allocations.repack import (
    capacity_repack_apply,
    capacity_repack_plan,
    fleet_products,
    repack_payload,
)
from fleet.api import serializers_capacity as sc
from fleet.api.common import error_responses
from fleet.api.limits import throttle_scope
from fleet.api.serializers import OperationSerializer
from fleet.core.errors import ServiceError


@extend_schema(
    parameters=[sc.CapacityQuerySerializer],
    responses={200: sc.CapacitySerializer, **error_responses(400, 401, 403)},
    description=(
        "Per GPU product: schedulable GPUs, each MIG profile's instances that fit now and after "
        "idle instances are reshaped, MPS free and stranded memory and client slots, and free "
        "whole GPUs; the fleet's fragmentation against its request mix, per host. Name a "
        "request in the query (`?kind=mig&profile=1g.10gb`, `?kind=mps&memory_mib=20000"
        "&max_compute_percent=50`, `?kind=gpu&gpu_count=2`) to learn how many replicas of it "
        "fit (`request`)."
    ),
)
@api_view(["GET"])
@throttle_scope("expensive")  # reads every GPU, partition and allocation
def capacity(request: Request) -> Response:
    """The fleet's capacity (any role)."""
    query = sc.CapacityQuerySerializer(data=request.query_params.dict())
    query.is_valid(raise_exception=True)
    return Response(fleet_capacity(sc.placement_request(dict(query.validated_data))))


@extend_schema(
    methods=["GET"],
    parameters=[sc.RepackQuerySerializer],
    responses={200: sc.RepackPlanSerializer, **error_responses(400, 401, 403)},
    description=(
        "A proposal, changing nothing: the moves (make before break) that empty `free_gpus` "
        "GPUs of `product` holding replicas, moving the fewest replicas. OR-Tools CP-SAT solves "
        "it within a time limit (`FLEET_REPACK_TIME_LIMIT_SECONDS`, 3 s by default); `bound` is "
        "its proven lower bound on the cost; the greedy plan answers when CP-SAT is not "
        "installed, the model is too big or it finds nothing in time (`method`, `status`, "
        "`reason`). Every placement rule counts (MIG placements beside what stays, MPS memory "
        "and client limits, whole GPUs, the replicas' host runtimes and labels); replicas move "
        "only to GPUs not being emptied, never to an idle GPU of the product. A GPU running a "
        "replica of several GPUs, MPS clients inside MIG or a move in progress is not emptied "
        "(`unmovable`). When it cannot be done the answer is still 200, with `feasible: false` "
        "and the `reason`."
    ),
)
@extend_schema(
    methods=["POST"],
    request=sc.RepackApplySerializer,
    responses={202: OperationSerializer, **error_responses(400, 401, 403, 409)},
    description=(
        "Plan and apply (operator): one `repack` operation empties the GPUs, at most "
        "`max_unavailable` at a time, each replica moved make before break; its `result` lists "
        "the GPUs freed. A failed move stops it with the reason, the replica still running "
        "where it was. 409: `repack.infeasible` (with the planner's reason), "
        "`repack.in_progress`."
    ),
)
@api_view(["GET", "POST"])
@throttle_scope("expensive")  # reads the fleet and runs a solver
def capacity_repack(request: Request) -> Response:
    """Propose (any role) or apply (operator) a repack."""
    if request.method == "POST":
        body = sc.RepackApplySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        operation = capacity_repack_apply(
            product_key=_product_key(data["product"]),
            count=data["free_gpus"],
            max_unavailable=data["max_unavailable"],
            requested_by=request.user,
        )
        return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)
    query = sc.RepackQuerySerializer(data=request.query_params.dict())
    query.is_valid(raise_exception=True)
    key = _product_key(query.validated_data["product"])
    plan = capacity_repack_plan(product_key=key, count=query.validated_data["free_gpus"])
    return Response(repack_payload(plan))


def _product_key(product: str) -> str:
    """The catalog key of a product of the fleet, named by key or by name (400 otherwise)."""
    keys = fleet_products()
    for key, name in keys.items():
        if product.lower() in (key.lower(), name.lower()):
            return key
    listed = ", ".join(sorted(keys)) or "none"
    raise ServiceError(
        "repack.unknown_product",
        f"The fleet has no GPU product {product!r}; it has: {listed}.",
        {"product": product, "products": sorted(keys)},
    )


@extend_schema(
    parameters=[sc.AdviceQuerySerializer],
    responses={200: sc.AdviceSerializer, **error_responses(400, 401, 403)},
    description=(
        "The layout advisor: MIG layouts for the product's schedulable GPUs that place the most "
        "waiting replicas (deployments' unplaced MIG replicas, and MPS replicas in new MIG "
        "instances that run MPS), then move the fewest running ones (a GPU whose running "
        "replicas must move is drained: all its replicas count as moved), solved by CP-SAT "
        "within `time_limit_s`. `rollout` is the exact body for `POST /rollouts/` (a layout per "
        "GPU that changes; the deployments whose waiting replicas the engine places when every "
        "GPU is reshaped); `solver` gives the objective, the proven bound, the gap, the status "
        "and the time."
    ),
)
@api_view(["GET"])
@throttle_scope("expensive")  # reads the fleet and runs the solver
def capacity_advice(request: Request) -> Response:
    """The layout advisor's proposal (any role)."""
    query = sc.AdviceQuerySerializer(data=request.query_params.dict())
    query.is_valid(raise_exception=True)
    data = dict(query.validated_data)
    kwargs = {"time_limit_s": data["time_limit_s"]} if "time_limit_s" in data else {}
    return Response(advice.capacity_advice(product=data["product"], **kwargs))
