"""Content negotiation: DRF's, except that ``?format=`` naming a format the endpoint does not
render is a 400 saying which ones it does (DRF answers 404, as for an unknown URL suffix, which
reads as "no such resource")."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import DefaultContentNegotiation


class Negotiation(DefaultContentNegotiation):
    def filter_renderers(self, renderers: Any, format: str) -> Any:
        found = [r for r in renderers if r.format == format]
        if not found:
            known = ", ".join(sorted({str(r.format) for r in renderers}))
            raise ValidationError({"format": [f"Unknown format {format[:40]!r}; use {known}."]})
        return found
