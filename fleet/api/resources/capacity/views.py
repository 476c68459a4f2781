"""``GET /capacity/``: what fits now, and what is stranded; ``/capacity/repack``: empty GPUs;
``GET /capacity/advice``: the layout advisor's rollout proposal (operators: it runs a solver)."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema
from redis.exceptions import RedisError
from rest_framework import exceptions, status
from rest_framework.decorators import api_view, permission_classes
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle

from fleet.allocations.planning import advice
from fleet.allocations.planning.capacity import fleet_capacity
from fleet.allocations.planning.repack_plans import (
    capacity_repack_plan,
    fleet_products,
    repack_payload,
)
from fleet.api.common import error_responses
from fleet.api.limits import _FailOpen, throttle_scope
from fleet.api.permissions import OperatorRole
from fleet.api.resources.capacity.serializers import (
    AdviceQuerySerializer,
    AdviceSerializer,
    CapacityQuerySerializer,
    CapacitySerializer,
    RepackApplySerializer,
    RepackPlanSerializer,
    RepackQuerySerializer,
    placement_request,
)
from fleet.api.resources.operations.serializers import OperationSerializer
from fleet.core.errors import ServiceError
from fleet.placement.advisor.values import DEFAULT_TIME_LIMIT_S
from fleet.workflows.repack import capacity_repack_apply


@extend_schema(
    parameters=[CapacityQuerySerializer],
    responses={200: CapacitySerializer, **error_responses(400, 401, 403)},
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
    query = CapacityQuerySerializer(data=request.query_params.dict())
    query.is_valid(raise_exception=True)
    return Response(fleet_capacity(placement_request(dict(query.validated_data))))


@extend_schema(
    methods=["GET"],
    parameters=[RepackQuerySerializer],
    responses={200: RepackPlanSerializer, **error_responses(400, 401, 403)},
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
    request=RepackApplySerializer,
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
        body = RepackApplySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        operation = capacity_repack_apply(
            product_key=_product_key(data["product"]),
            count=data["free_gpus"],
            max_unavailable=data["max_unavailable"],
            requested_by=request.user,
        )
        return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)
    query = RepackQuerySerializer(data=request.query_params.dict())
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


# -- the layout advisor: operators only, one solve per user per interval, one at a time ----------


class AdviceThrottle(_FailOpen, SimpleRateThrottle):
    """One solve per user per ``FLEET_ADVICE_MIN_INTERVAL_SECONDS`` (0: no limit), counted in
    the throttles' cache (Redis: across processes), and, as they do, let through while that
    cache is unreachable. Checked by the view once the query is valid and no other solve
    runs, so that neither a refused query nor a busy answer counts."""

    scope = "advice"

    def __init__(self) -> None:
        interval = float(settings.FLEET_ADVICE_MIN_INTERVAL_SECONDS)
        self.rate = f"1/{interval:g}s" if interval > 0 else None  # None: no limit
        self.num_requests, self.duration = 1, interval

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}

    def forget(self) -> None:
        """The solve did not run after all (the service refused the query)."""
        key = getattr(self, "key", None)
        if key is not None:
            with contextlib.suppress(RedisError, OSError):  # unreachable: it will expire
                self.cache.delete(key)


class _Solves:
    """At most ``FLEET_ADVISOR_CONCURRENCY`` advisor solves at a time in this process (each
    takes several threads); the setting is read at each start, so tests may change it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._ends: list[float] = []  # time.monotonic() when each running solve's limit ends

    def start(self, time_limit_s: float) -> float | None:
        """A ticket for a new solve, or ``None`` when as many are running as allowed."""
        with self._guard:
            if len(self._ends) >= max(1, int(settings.FLEET_ADVISOR_CONCURRENCY)):
                return None
            ticket = time.monotonic() + time_limit_s
            self._ends.append(ticket)
            return ticket

    def retry_after(self) -> int:
        """Whole seconds until the first running solve should be done (at least 1)."""
        with self._guard:
            first = min(self._ends, default=time.monotonic())
        return max(1, math.ceil(first - time.monotonic()))

    def finish(self, ticket: float) -> None:
        with self._guard:
            self._ends.remove(ticket)


_one_solve = _Solves()

ADVICE_REFUSALS = error_responses(
    described={
        429: "`throttled`: this user asked less than FLEET_ADVICE_MIN_INTERVAL_SECONDS ago; "
        "`advice.busy`: `FLEET_ADVISOR_CONCURRENCY` solves are running. `Retry-After` says when "
        "to ask again."
    }
)


@extend_schema(
    parameters=[AdviceQuerySerializer],
    responses={
        200: AdviceSerializer,
        **error_responses(400, 401, 403),
        **ADVICE_REFUSALS,
    },
    description=(
        "The layout advisor: MIG layouts for the product's schedulable GPUs that place the most "
        "waiting replicas (deployments' unplaced MIG replicas, and MPS replicas in new MIG "
        "instances that run MPS), then move the fewest running ones (a GPU whose running "
        "replicas must move is drained: all its replicas count as moved), solved by CP-SAT "
        "within `time_limit_s`. `rollout` is the exact body for `POST /rollouts/` (a layout per "
        "GPU that changes; the deployments whose waiting replicas the engine places when every "
        "GPU is reshaped); `solver` gives the objective, the proven bound, the gap, the status "
        "and the time.\n\n"
        "Each call runs the solver, so it takes the operator role (403 for other roles), and "
        "is limited: one solve per user per `FLEET_ADVICE_MIN_INTERVAL_SECONDS` (30 s by "
        "default; 429 `throttled`) and `FLEET_ADVISOR_CONCURRENCY` solves at a time per "
        "server process (1 by default; 429 `advice.busy`); both 429s carry `Retry-After`. A "
        "query refused with 400 does not count."
    ),
)
@api_view(["GET"])
@permission_classes([OperatorRole])
@throttle_scope("expensive")  # reads the fleet and runs the solver
def capacity_advice(request: Request) -> Response:
    """The layout advisor's proposal (operators; rate-limited, a bounded number at once)."""
    query = AdviceQuerySerializer(data=request.query_params.dict())
    query.is_valid(raise_exception=True)
    data = dict(query.validated_data)
    kwargs = {"time_limit_s": data["time_limit_s"]} if "time_limit_s" in data else {}
    ticket = _one_solve.start(kwargs.get("time_limit_s", DEFAULT_TIME_LIMIT_S))
    if ticket is None:
        wait = _one_solve.retry_after()
        busy = ServiceError(
            "advice.busy",
            f"The layout advisor is solving another request; ask again in {wait} s.",
            {"retry_after_s": wait},
        )
        return Response(busy.as_dict(), status=429, headers={"Retry-After": str(wait)})
    try:
        throttle = AdviceThrottle()
        if not throttle.allow_request(request, request.parser_context["view"]):
            raise exceptions.Throttled(
                wait=throttle.wait(),
                detail=f"One layout advice per user every {throttle.duration:g} s.",
            )
        try:
            return Response(advice.capacity_advice(product=data["product"], **kwargs))
        except ServiceError:
            throttle.forget()
            raise
    finally:
        _one_solve.finish(ticket)
