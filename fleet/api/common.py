"""What every REST API view module shares: the documented error responses, the read viewset
base, and the parsing of bodies and ids into the envelope's errors."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import Model
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import viewsets
from rest_framework.request import Request

from fleet.api import serializers as s
from fleet.core.errors import NotFound
from fleet.core.filters import ID_MAX

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


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
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


def validated(serializer_class: type[Any], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def parse_id(raw: Any) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise NotFound("not_found", f"No object with id {str(raw)[:40]!r}.") from None
    if not 1 <= value <= ID_MAX:
        raise NotFound("not_found", f"No object with id {str(raw)[:40]!r}.")
    return value
