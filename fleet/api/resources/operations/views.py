"""``/operations/``: the audit trail, as JSON or CSV."""

from __future__ import annotations

from typing import Any

from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.api.common import ReadViewSet, documented_reads
from fleet.api.export import CsvRenderer, operations_csv
from fleet.api.resources.operations.serializers import OperationSerializer
from fleet.core.filters import OperationFilter
from fleet.core.models import Operation


@documented_reads(OperationSerializer)
class OperationViewSet(ReadViewSet[Operation]):
    """The audit trail: who asked for what, when, and how it ended. Filter by ``user``, ``kind``,
    ``status`` and time (``since``, ``until``); ``Accept: text/csv`` or ``?format=csv`` exports
    every matching row as CSV."""

    serializer_class = OperationSerializer
    filterset_class = OperationFilter
    ordering_fields = ["created_at", "status", "kind"]
    queryset = Operation.objects.select_related("requested_by", "deployment").order_by(
        "-created_at", "-id"
    )

    def get_renderers(self) -> list[Any]:
        renderers = super().get_renderers()
        return [*renderers, CsvRenderer()] if getattr(self, "action", None) == "list" else renderers

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        renderer = getattr(request, "accepted_renderer", None)
        if isinstance(renderer, CsvRenderer):
            return operations_csv(self.filter_queryset(self.get_queryset()))
        return super().list(request, *args, **kwargs)

    def handle_exception(self, exc: Exception) -> Response:
        # Errors are the JSON envelope, whatever format was asked for.
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = "application/json"
        return super().handle_exception(exc)
