"""FilterSets shared by the API and the dashboard (one vocabulary for both, as NetBox does):
the operations feed, and the UTC time filter every list uses."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField

from fleet.core.models import Operation, OperationKind, OperationStatus


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 time, in UTC: PostgreSQL refuses offsets past ±15:59 (which ISO 8601 and
    Python accept), and a time near year 1 may not convert at all; both are a 400."""

    def to_python(self, value: Any) -> datetime | None:
        parsed = super().to_python(value)
        if not isinstance(parsed, datetime):
            return None
        try:
            return parsed.astimezone(UTC)
        except (OverflowError, ValueError):
            raise forms.ValidationError(
                "Enter a time that exists in UTC.", code="invalid"
            ) from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField


# The largest row id: ids are 64-bit (BigAutoField). A larger number is no id of ours, and
# SQLite cannot even bind it (a 500 where a 400 is due).
ID_MAX = 2**63 - 1


class IdFilter(django_filters.Filter):
    """``?gpu=7``: a row id, a whole number from 1 to :data:`ID_MAX`; anything else is a 400
    (a ``NumberFilter`` takes ``7.5`` and numbers no database column holds)."""

    field_class = forms.IntegerField

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", ID_MAX)
        super().__init__(*args, **kwargs)


class OperationFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=OperationKind.choices)
    status = django_filters.ChoiceFilter(choices=OperationStatus.choices)
    host = IdFilter(field_name="host_id")
    gpu = IdFilter(field_name="gpu_id")
    deployment = IdFilter(field_name="deployment_id")
    requested_by = django_filters.CharFilter(field_name="requested_by_name", max_length=150)
    user = django_filters.CharFilter(
        field_name="requested_by_name", max_length=150, label="Requested by (username)"
    )
    since = UtcIsoDateTimeFilter(
        field_name="created_at", lookup_expr="gte", label="Created at or after"
    )
    until = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt", label="Created before")

    class Meta:
        model = Operation
        fields = ["kind", "status", "host", "gpu", "deployment"]
