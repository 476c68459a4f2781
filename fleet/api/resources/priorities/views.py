"""``/priorities/``: the ordered priority classes. Every role reads them; fleet admins define,
change and delete them (``fleet.core.priorities``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.allocations.priorities import priority_class_delete
from fleet.api.common import error_responses
from fleet.api.permissions import require_fleet_admin
from fleet.api.resources.priorities.serializers import PriorityClassSerializer
from fleet.core.errors import ServiceError
from fleet.core.models import PriorityClass
from fleet.core.priorities import (
    priority_class_create,
    priority_class_get,
    priority_class_update,
)


def priority_body(priority: PriorityClass) -> dict[str, Any]:
    return {"name": priority.name, "value": priority.value, "description": priority.description}


def _body(request: Request) -> Mapping[str, Any]:
    if not isinstance(request.data, Mapping):
        raise ServiceError("malformed_request", "The body must be a JSON object.")
    return request.data


@extend_schema(
    methods=["GET"],
    responses={200: PriorityClassSerializer(many=True), **error_responses(401, 403)},
    description="Every priority class, the highest first.",
)
@extend_schema(
    methods=["POST"],
    request=PriorityClassSerializer,
    responses={201: PriorityClassSerializer, **error_responses(400, 401, 403, 409)},
    description="Fleet admins only: a new class (`name` and `value` unique, else 409 "
    "`priority.taken`).",
)
@api_view(["GET", "POST"])
def priorities(request: Request) -> Response:
    if request.method == "POST":
        require_fleet_admin(request.user, "Only fleet admins define priority classes.")
        body = _body(request)
        created = priority_class_create(
            name=body.get("name"),
            value=body.get("value"),
            description=body.get("description", ""),
            requested_by=request.user,
        )
        return Response(priority_body(created), status=status.HTTP_201_CREATED)
    return Response([priority_body(p) for p in PriorityClass.objects.order_by("-value")])


@extend_schema(
    methods=["GET"],
    responses={200: PriorityClassSerializer, **error_responses(401, 403, 404)},
)
@extend_schema(
    methods=["PATCH"],
    request=PriorityClassSerializer,
    responses={200: PriorityClassSerializer, **error_responses(400, 401, 403, 404, 409)},
    description="Fleet admins only: change its `value` or `description` (its name stays).",
)
@extend_schema(
    methods=["DELETE"],
    responses={204: None, **error_responses(401, 403, 404, 409)},
    description="Fleet admins only: a class still named by a deployment or a team's "
    "`default_priority` stays (409 `priority.in_use`).",
)
@api_view(["GET", "PATCH", "DELETE"])
def priority(request: Request, name: str) -> Response:
    if request.method == "GET":
        return Response(priority_body(priority_class_get(name)))
    require_fleet_admin(request.user, "Only fleet admins change priority classes.")
    if request.method == "DELETE":
        priority_class_delete(name=name, requested_by=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
    changed = priority_class_update(name=name, changes=_body(request), requested_by=request.user)
    return Response(priority_body(changed))
