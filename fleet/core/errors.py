"""The error envelope: every API error is ``{"code", "message", "details"}``.

Services raise :class:`ServiceError` (or a subclass) with a stable code; the API turns it, and
every DRF/Django error, into the envelope with the right HTTP status.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response

from fleet.domain import Violation

logger = logging.getLogger(__name__)


class ServiceError(Exception):
    """A refused write. Nothing was changed when this is raised."""

    status_code: int = status.HTTP_400_BAD_REQUEST

    def __init__(
        self,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        status_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}
        if status_code is not None:
            self.status_code = status_code

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class NotFound(ServiceError):
    status_code: int = status.HTTP_404_NOT_FOUND


class Conflict(ServiceError):
    status_code: int = status.HTTP_409_CONFLICT


class RuleViolation(ServiceError):
    """The pure rules refused the change; ``details.violations`` lists every broken rule and
    ``code`` is the first one's (stable: the same refusal has the same code however many other
    rules it broke)."""

    status_code: int = status.HTTP_422_UNPROCESSABLE_ENTITY

    def __init__(self, message: str, violations: Iterable[Violation], **details: Any) -> None:
        listed = [v.as_dict() for v in violations]
        code = listed[0]["code"] if listed else "rules.violated"
        super().__init__(code, message, {"violations": listed, **details})


_DRF_CODES = {
    exceptions.NotAuthenticated: "auth.not_authenticated",
    exceptions.AuthenticationFailed: "auth.failed",
    exceptions.PermissionDenied: "auth.forbidden",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.ParseError: "malformed_request",
    exceptions.Throttled: "throttled",
    exceptions.ValidationError: "invalid",
}


def _drf_code(exc: exceptions.APIException) -> str:
    for cls, code in _DRF_CODES.items():
        if isinstance(exc, cls):
            return code
    return "error"


def _message(detail: Any) -> str:
    if isinstance(detail, list) and detail:
        return _message(detail[0])
    if isinstance(detail, dict) and detail:
        key, value = next(iter(detail.items()))
        inner = _message(value)
        return inner if key == "non_field_errors" else f"{key}: {inner}"
    return str(detail)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's exception hook: map every error to the envelope."""
    if isinstance(exc, ServiceError):
        return Response(exc.as_dict(), status=exc.status_code)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if not isinstance(exc, exceptions.APIException):
        return None
    code = _drf_code(exc)
    if isinstance(exc, exceptions.ValidationError):
        body = {"code": code, "message": _message(exc.detail), "details": {"fields": exc.detail}}
    else:
        body = {"code": code, "message": str(exc.detail), "details": {}}
    response = Response(body, status=exc.status_code)
    if getattr(exc, "auth_header", None):
        response["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
    if getattr(exc, "wait", None):
        response["Retry-After"] = str(int(exc.wait))  # type: ignore[attr-defined]
    return response
