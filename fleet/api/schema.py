"""OpenAPI: our authentication schemes and bounded maps (drf-spectacular extensions), and the
413/429 refusals of :mod:`fleet.api.parsers` and :mod:`fleet.api.limits` on every operation that
can give them."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerFieldExtension,
)
from drf_spectacular.openapi import AutoSchema

from fleet.api.common import error_responses


class HostTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "fleet.api.resources.agent.views.HostTokenAuthentication"
    name = "hostToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "A host agent's token: `Token flh_…` (agents only).",
        }


class BoundedDictFieldExtension(OpenApiSerializerFieldExtension):  # type: ignore[no-untyped-call]
    """A :class:`fleet.api.fields.BoundedDictField` is an object with ``maxProperties``."""

    target_class = "fleet.api.fields.BoundedDictField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: str) -> Any:
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        return {**schema, "maxProperties": self.target.max_entries}


class LimitedAutoSchema(AutoSchema):
    """The default schema, plus 429 where a throttle applies and 413 where a body is accepted.

    Every API view has the default throttles and every body goes through a capped parser, so
    declaring these per view would only leave some out.
    """

    def get_operation(
        self, path: str, path_regex: str, path_prefix: str, method: str, registry: Any
    ) -> dict[str, Any] | None:
        operation: dict[str, Any] | None = super().get_operation(
            path, path_regex, path_prefix, method, registry
        )
        if operation is None:
            return None
        responses = operation.setdefault("responses", {})
        if self.view.get_throttles():
            responses.setdefault("429", self._envelope("429", "Too many requests; see Retry-After"))
        if self.method in {"POST", "PUT", "PATCH"}:
            responses.setdefault("413", self._envelope("413", "Request body too large"))
        return operation

    def _envelope(self, code: str, description: str) -> Any:
        response = error_responses(described={int(code): description})[int(code)]
        return self._get_response_for_code(response, code)  # type: ignore[no-untyped-call]
