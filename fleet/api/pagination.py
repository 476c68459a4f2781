"""Limit/offset pagination with bounds (a huge ``limit`` or ``offset`` is clamped, never a 500)."""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

MAX_OFFSET = 10**9


class BoundedPagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000

    def get_offset(self, request: Request) -> int:
        return min(int(super().get_offset(request)), MAX_OFFSET)
