"""JSON request bodies with a size cap and a nesting cap, refused with the error envelope.

DRF hands a ``JSONParser`` the whole of ``request.body`` (``DATA_UPLOAD_MAX_MEMORY_SIZE``, one
limit for every endpoint, refused with Django's plain 400). These parsers are not ``JSONParser``
subclasses, so DRF hands them the request stream instead: each reads at most its own cap plus
one byte, and a body over the cap is a 413 envelope. Deep nesting would make any code that walks
the value raise ``RecursionError``, which DRF turns into a 500; it is refused here as a 400
before parsing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import accumulate
from typing import IO, Any

import orjson
from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser
from rest_framework.renderers import JSONRenderer

from fleet.core.errors import ServiceError

# Far deeper than any payload Fleet defines (an agent hello is 9 levels), far below the
# interpreter's recursion limit, so nothing that walks a parsed body can overflow the stack.
MAX_JSON_DEPTH = 64

TOO_LARGE = "request.too_large"
UTF8 = frozenset({"utf-8", "utf8"})

# A JSON string with its escapes; brackets inside strings do not nest anything.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NESTING = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
# The escape of U+0000 (not an escaped backslash followed by "u0000"): PostgreSQL's text and
# jsonb cannot hold that character, so a string carrying it would be a 500 wherever it is stored
# or compared; no field Fleet defines has a use for it.
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def json_depth(raw: bytes) -> int:
    """How deeply the arrays and objects of a JSON text nest, without parsing it (C-speed scans)."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_NESTING.__getitem__, brackets)), default=0)


def too_large(max_bytes: int) -> ServiceError:
    """The 413 envelope for a body over ``max_bytes`` (also sent by the ASGI cap)."""
    return ServiceError(
        TOO_LARGE,
        f"The request body is larger than {max_bytes} bytes.",
        {"max_bytes": max_bytes},
        status_code=413,
    )


class JsonParser(BaseParser):
    """``application/json`` of at most ``settings.<limit_setting>`` bytes and 64 levels."""

    media_type = "application/json"
    renderer_class = JSONRenderer  # what the browsable API's raw-data form sends
    limit_setting = "FLEET_MAX_JSON_BYTES"

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        context = parser_context or {}
        max_bytes: int = getattr(settings, self.limit_setting)
        request = context.get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if declared and declared.isdecimal() and int(declared) > max_bytes:
            raise too_large(max_bytes)  # refused without reading a byte
        raw = stream.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise too_large(max_bytes)
        if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and json_depth(raw) > MAX_JSON_DEPTH:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels.")
        value = self._loads(raw, context.get("encoding") or settings.DEFAULT_CHARSET)
        if b"\\u0000" in raw and _NUL.search(raw):
            raise ParseError(
                "JSON parse error - a string holds U+0000 (NUL), which no field accepts."
            )
        return value

    def _loads(self, raw: bytes, encoding: str) -> dict[str, Any]:
        """orjson: strict JSON (no NaN or Infinity, no number that overflows a double) and
        valid Unicode only. The standard library accepts a lone surrogate (``"\\udb3f"``),
        which no response can then encode: an error message quoting it was a 500."""
        try:
            text: bytes | str = raw if encoding.lower() in UTF8 else raw.decode(encoding)
            value: dict[str, Any] = orjson.loads(text)
        except (ValueError, UnicodeError) as exc:  # orjson.JSONDecodeError is a ValueError
            raise ParseError(f"JSON parse error - {exc}") from None
        return value


class EnrollJsonParser(JsonParser):
    """``POST /agent/enroll``: anonymous, so the tightest cap (two short strings fit in 1 KiB)."""

    limit_setting = "FLEET_MAX_ENROLL_BYTES"


class ReportJsonParser(JsonParser):
    """``POST /agent/report``: up to 1000 messages, hellos included, from an authenticated host."""

    limit_setting = "FLEET_MAX_REPORT_BYTES"
