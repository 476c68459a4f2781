"""Host labels: a small string-to-string map, bounded like Kubernetes labels.

Keys are Kubernetes label keys (an optional DNS prefix and ``/``, then a name of letters, digits,
``-``, ``_`` and ``.`` that starts and ends with a letter or digit), at most 63 characters in
all; values are at most 63 printable characters. A host (or a deployment's requirement) has at
most 32 labels.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fleet.core.errors import ServiceError

MAX_LABELS = 32
MAX_KEY_CHARS = 63
MAX_VALUE_CHARS = 63
_KEY = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def labels_problems(raw: Any) -> list[str]:
    """Every reason ``raw`` is not a valid label map (empty when it is)."""
    if not isinstance(raw, Mapping):
        return ["Labels must be an object of string keys and string values."]
    problems = []
    if len(raw) > MAX_LABELS:
        problems.append(f"At most {MAX_LABELS} labels ({len(raw)} given).")
    for key, value in list(raw.items())[: MAX_LABELS + 1]:
        shown = str(key)[:80]
        if not isinstance(key, str) or len(key) > MAX_KEY_CHARS or not _KEY.match(key):
            problems.append(
                f"Key {shown!r}: letters, digits, '-', '_' and '.' (an optional 'prefix/' "
                f"first), starting and ending with a letter or digit, at most {MAX_KEY_CHARS} "
                "characters."
            )
        if not isinstance(value, str) or len(value) > MAX_VALUE_CHARS or not value.isprintable():
            problems.append(
                f"Value of {shown!r}: a string of at most {MAX_VALUE_CHARS} printable characters."
            )
    return problems


def labels_checked(raw: Any, *, field: str = "labels") -> dict[str, str]:
    """``raw`` as a label map, or a 400 ``labels.invalid`` listing every problem."""
    problems = labels_problems(raw)
    if problems:
        raise ServiceError(
            "labels.invalid",
            f"Invalid {field}: {problems[0]}",
            {"field": field, "problems": problems[:20]},
        )
    return {str(k): str(v) for k, v in raw.items()}
