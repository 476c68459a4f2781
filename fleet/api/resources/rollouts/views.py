"""Fleet-wide layout rollouts: ``/rollouts/`` (one layout for every GPU a selector picks, a
layout per GPU, or a mig-parted config's entries, in waves of drain-and-reshape), their dry run,
resume and abort."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.allocations.layout_rollouts import (
    Selector,
    layout_rollout_abort,
    layout_rollout_resume,
    layout_rollout_start,
)
from fleet.allocations.migparted_rollouts import migparted_layouts
from fleet.api.common import error_responses, validated
from fleet.api.resources.operations.serializers import OperationSerializer
from fleet.api.resources.rollouts.serializers import DryRunSerializer, LayoutRolloutSerializer
from fleet.core.errors import NotFound
from fleet.core.models import Operation, OperationKind
from fleet.partitioning.services import LayoutSpec


@extend_schema(
    methods=["GET"],
    responses={200: OperationSerializer(many=True), **error_responses(401, 403)},
    description="The latest 100 layout rollouts (`layout_rollout` operations), newest first.",
)
@extend_schema(
    methods=["POST"],
    request=LayoutRolloutSerializer,
    responses={
        202: OperationSerializer,
        200: DryRunSerializer,
        **error_responses(400, 401, 403, 409),
    },
    description=(
        "Reshape every GPU the selector picks (a product, host labels, hosts or GPUs; at least "
        "one) to `layout`, or each GPU to its own entry of `layouts` (the layout advisor's "
        "proposal, `GET /capacity/advice`), or to its entry of a mig-parted config "
        "(`migparted`: `config` as YAML/JSON text or an object, `name` the config to apply; "
        "entries select GPUs by `devices` index and `device-filter`; a bad config is a 400 and "
        "creates nothing), with drain-and-reshape, in waves of at most `max_unavailable` GPUs; "
        "a GPU whose new layout keeps every partition that runs a replica is reshaped in place; "
        "GPUs already in their layout are skipped. The first GPU that fails pauses the rollout "
        "with its reason (`payload.paused`); resume or abort it. `dry_run`: the GPUs, the "
        "replicas that would move and whether each has somewhere to go (changes nothing)."
    ),
)
@api_view(["GET", "POST"])
def rollouts(request: Request) -> Response:
    if request.method == "GET":
        rows = Operation.objects.filter(kind=OperationKind.LAYOUT_ROLLOUT).order_by("-id")[:100]
        return Response(OperationSerializer(rows, many=True).data)
    data = validated(LayoutRolloutSerializer, request)
    raw = data["selector"]
    selector = Selector(
        product=raw.get("product", ""),
        labels=raw.get("labels") or {},
        hosts=tuple(raw.get("hosts") or ()),
        gpus=tuple(raw.get("gpus") or ()),
    )
    layout: LayoutSpec | dict[int, LayoutSpec]
    if "layout" in data:
        layout = LayoutSpec.from_json(data["layout"])
    elif "layouts" in data:
        layout = {e["gpu"]: LayoutSpec.from_json(e["layout"]) for e in data["layouts"]}
    else:
        layout = migparted_layouts(
            selector=selector, config=data["migparted"]["config"], name=data["migparted"]["name"]
        )
    result = layout_rollout_start(
        selector=selector,
        layout=layout,
        max_unavailable=data["max_unavailable"],
        timeout_s=float(data["timeout_s"]),
        dry_run=data["dry_run"],
        requested_by=request.user,
        place_waiting=tuple(data.get("place_waiting") or ()),
    )
    if isinstance(result, Operation):
        return Response(OperationSerializer(result).data, status=status.HTTP_202_ACCEPTED)
    return Response(result)


@extend_schema(responses={200: OperationSerializer, **error_responses(401, 403, 404)})
@api_view(["GET"])
def rollout(request: Request, pk: int) -> Response:
    found = Operation.objects.filter(pk=pk, kind=OperationKind.LAYOUT_ROLLOUT).first()
    if found is None:
        raise NotFound("rollout.not_found", f"Layout rollout {pk} does not exist.", {})
    return Response(OperationSerializer(found).data)


@extend_schema(
    request=None,
    responses={200: OperationSerializer, **error_responses(401, 403, 404, 409)},
    description="Resume a paused rollout: the GPU that failed is tried again first.",
)
@api_view(["POST"])
def rollout_resume(request: Request, pk: int) -> Response:
    operation = layout_rollout_resume(operation_id=pk, requested_by=request.user)
    return Response(OperationSerializer(operation).data)


@extend_schema(
    request=None,
    responses={200: OperationSerializer, **error_responses(401, 403, 404, 409)},
    description="Abort: drains under way finish (each rolls its GPU back if it fails); no new "
    "one starts.",
)
@api_view(["POST"])
def rollout_abort(request: Request, pk: int) -> Response:
    operation = layout_rollout_abort(operation_id=pk, requested_by=request.user)
    return Response(OperationSerializer(operation).data)
