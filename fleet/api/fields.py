"""Serializer fields shared by the API's request bodies."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.core.filters import ID_MAX


class IdField(serializers.IntegerField):
    """A row id in a request body: a whole number from 1 to 2^63-1. A larger one is no row of
    ours and is a 400 here, not a database error later (SQLite cannot bind it)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", ID_MAX)
        super().__init__(**kwargs)
