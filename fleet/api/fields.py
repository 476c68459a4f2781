"""Serializer fields shared by the API's request bodies."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.core.filters import ID_MAX
from fleet.inventory.labels import MAX_LABELS, MAX_VALUE_CHARS, labels_problems


class IdField(serializers.IntegerField):
    """A row id in a request body: a whole number from 1 to 2^63-1. A larger one is no row of
    ours and is a 400 here, not a database error later (SQLite cannot bind it)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", ID_MAX)
        super().__init__(**kwargs)


class BoundedListField(serializers.ListField):
    """A list with a required ``max_length``, refused before any item is validated.

    DRF's ``ListField`` validates every item first and counts them afterwards: a 20,000-item list
    cost 300 ms of a server process before its refusal (``bench_refusals``)."""

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("max_length") is None:
            raise TypeError("BoundedListField needs a max_length")
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, list) and self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return super().to_internal_value(data)


class BoundedDictField(serializers.DictField):
    """A map of at most ``max_entries`` keys, refused before any value is validated; the schema
    says so (``maxProperties``, :class:`fleet.api.schema.BoundedDictFieldExtension`)."""

    default_error_messages = {
        "max_entries": "Ensure this field has no more than {max_entries} keys."
    }

    def __init__(self, *, max_entries: int, **kwargs: Any) -> None:
        self.max_entries = max_entries
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Any:
        self.check_size(data)
        return super().to_internal_value(data)

    def check_size(self, data: Any) -> None:
        if isinstance(data, dict) and len(data) > self.max_entries:
            self.fail("max_entries", max_entries=self.max_entries)


class LabelsField(BoundedDictField):
    """A label map: at most 32 labels, Kubernetes-like keys of at most 63 characters, values
    of at most 63 printable characters (:mod:`fleet.inventory.labels`)."""

    child = serializers.CharField(max_length=MAX_VALUE_CHARS, allow_blank=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_entries=MAX_LABELS, **kwargs)

    def to_internal_value(self, data: Any) -> dict[str, str]:
        self.check_size(data)
        problems = labels_problems(data)
        if problems:
            raise serializers.ValidationError(problems[:20])
        return dict(super().to_internal_value(data))


@extend_schema_field(
    {
        "oneOf": [
            {"type": "integer", "minimum": 1, "maximum": ID_MAX},
            {"type": "string", "minLength": 1, "maxLength": 100},
        ]
    }
)
class TeamRefField(serializers.Field):  # type: ignore[type-arg]
    """A team in a request body: its id, or its slug."""

    default_error_messages = {"invalid": "A team is an id (a whole number) or a slug."}

    def to_internal_value(self, data: Any) -> int | str:
        if isinstance(data, int) and not isinstance(data, bool) and 1 <= data <= ID_MAX:
            return data
        # No NUL: PostgreSQL cannot compare a text holding one (a 500, not a 400).
        if isinstance(data, str) and 0 < len(data.strip()) <= 100 and "\x00" not in data:
            return data.strip()
        raise serializers.ValidationError(self.error_messages["invalid"], code="invalid")

    def to_representation(self, value: Any) -> Any:
        return value
