"""CSV export of the operations feed (``Accept: text/csv`` or ``?format=csv``): the same filters
as the JSON list, every matching row newest first (at most :data:`MAX_CSV_ROWS`), streamed.
No payload column (it may hold another team's workload spec); URLs in the summary and the
reason lose their credentials and query strings.

Every text cell is quoted (a spreadsheet splitting on ``;`` or ``,`` keeps it whole) and one that
a spreadsheet would run as a formula gets a leading ``'`` (OWASP, CSV injection); numbers (ids,
generations) are bare."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from typing import Any

from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from rest_framework.renderers import BaseRenderer

from fleet.core.models import Operation
from fleet.core.redaction import urls_redacted

MAX_CSV_ROWS = 100_000
COLUMNS = (
    "id",
    "created_at",
    "finished_at",
    "kind",
    "status",
    "requested_by",
    "summary",
    "reason",
    "host",
    "gpu",
    "deployment",
    "generation",
)


class CsvRenderer(BaseRenderer):
    """Chosen by content negotiation; the view streams the body itself (see
    :func:`operations_csv`), so this only names the media type and the format."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        return data if isinstance(data, bytes) else str(data).encode()


class _Echo:
    def write(self, value: str) -> str:
        return value


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    # A text cell that a spreadsheet would run as a formula is made text (OWASP: CSV injection).
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return "" if value is None else value


def csv_writer(out: Any) -> Any:
    """A writer that quotes every cell but numbers (``None`` is an empty quoted cell)."""
    return csv.writer(out, quoting=csv.QUOTE_NONNUMERIC)


def _rows(operations: Iterable[Operation]) -> Iterator[list[Any]]:
    yield list(COLUMNS)
    for op in operations:
        yield [
            _cell(v)
            for v in (
                op.pk,
                op.created_at.isoformat(),
                op.finished_at.isoformat() if op.finished_at else None,
                op.kind,
                op.status,
                op.requested_by_name,
                urls_redacted(op.summary),  # a webhook's URL: no credentials, no query
                urls_redacted(op.reason),
                op.host_id,
                op.gpu_id,
                op.deployment_id,
                op.generation,
            )
        ]


def operations_csv(queryset: QuerySet[Operation]) -> StreamingHttpResponse:
    writer = csv_writer(_Echo())
    rows = queryset.select_related("requested_by")[:MAX_CSV_ROWS].iterator(chunk_size=2000)
    response = StreamingHttpResponse(
        (writer.writerow(row) for row in _rows(rows)), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = 'attachment; filename="operations.csv"'
    return response
