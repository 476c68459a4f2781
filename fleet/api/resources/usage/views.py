"""``GET /usage``: chargeback sums per team, deployment or product over a window, as JSON or
CSV (:mod:`fleet.allocations.accounting.usage`)."""

from __future__ import annotations

import io
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.allocations.accounting.usage import UNITS, usage_report, usage_window
from fleet.api.common import error_responses
from fleet.api.export import CsvRenderer, _cell, csv_writer
from fleet.api.resources.usage.serializers import UsageQuerySerializer, UsageReportSerializer


def usage_csv(report: dict[str, Any]) -> str:
    out = io.StringIO()
    writer = csv_writer(out)  # every text cell quoted: a ';'-separated sheet keeps it whole
    writer.writerow([report["group_by"], "name", *UNITS, "from", "to"])
    start, end = report["from"].isoformat(), report["to"].isoformat()
    for row in report["groups"]:
        writer.writerow(
            [_cell(v) for v in (row["key"], row["name"], *(row[u] for u in UNITS), start, end)]
        )
    return out.getvalue()


class UsageView(APIView):
    """Chargeback (any role)."""

    renderer_classes = [JSONRenderer, CsvRenderer]
    throttle_scope = "expensive"  # reads every interval of the window

    @extend_schema(
        parameters=[UsageQuerySerializer],
        responses={
            (200, "application/json"): UsageReportSerializer,
            (200, "text/csv"): OpenApiResponse(
                OpenApiTypes.STR, description="One row per group: key, name, the units, window."
            ),
            **error_responses(400, 401, 403),
        },
        description=(
            "What each team, deployment or product (`group_by`) held over `[from, to)`: every "
            "allocation counts from its creation to its deletion (releasing time included), "
            "clipped to the window; one still there counts until now. Units: MIG "
            "compute-slice-hours, MPS GiB-hours and compute-%-hours, whole-GPU-hours, and "
            "GPU-equivalent hours across kinds. `Accept: text/csv` or `?format=csv`: one CSV "
            "row per group. 400: `usage.bad_window` (from not before to), "
            "`usage.window_too_long` (over 400 days), `invalid` (malformed dates or group_by)."
        ),
    )
    def get(self, request: Request) -> Response:
        params = request.query_params.dict()
        params.pop("format", None)
        query = UsageQuerySerializer(data=params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        window = usage_window(data.get("from"), data.get("to"), data.get("group_by"))
        report = usage_report(window)
        if isinstance(getattr(request, "accepted_renderer", None), CsvRenderer):
            response = Response(usage_csv(report).encode(), content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = 'attachment; filename="usage.csv"'
            return response
        return Response(UsageReportSerializer(report).data)

    def handle_exception(self, exc: Exception) -> Response:
        # Errors are the JSON envelope, whatever format was asked for.
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = "application/json"
        return super().handle_exception(exc)
