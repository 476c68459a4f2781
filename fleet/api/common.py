"""What every REST API view module shares: the error envelope and its documented responses
(:func:`error_responses`, the one helper every view documents its errors with), the read
viewset base, and the parsing of bodies and ids into the envelope's errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from django.db.models import Model
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.request import Request

from fleet.core.errors import NotFound
from fleet.core.filters import ID_MAX

_M = TypeVar("_M", bound=Model)


class ErrorSerializer(serializers.Serializer[Any]):
    code = serializers.CharField(help_text="Stable machine-readable code, e.g. `mig.overlap`.")
    message = serializers.CharField()
    details = serializers.DictField(
        help_text="Facts about the error; `violations` lists broken rules."
    )


ERROR_DESCRIPTIONS = {
    400: "Malformed or invalid input",
    401: "Not authenticated",
    403: "Role too low",
    404: "Not found",
    409: "Conflicts with the current state",
    422: "Refused by the MIG/MPS/placement rules",
    429: "Too many requests",
    504: "Timed out",
}


def error_responses(
    *codes: int, described: Mapping[int, str] | None = None
) -> dict[int, OpenApiResponse]:
    """The OpenAPI responses of ``codes`` (each the error envelope with its usual description),
    plus those of ``described``, each with its own description (what that view's error means)."""
    texts = {code: ERROR_DESCRIPTIONS[code] for code in codes} | dict(described or {})
    return {
        code: OpenApiResponse(ErrorSerializer, description=text) for code, text in texts.items()
    }


READ_ERRORS = error_responses(400, 401, 403, 404)


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
