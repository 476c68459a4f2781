"""Values shared by the pure domain packages (``fleet.mig``, ``fleet.mps``, ``fleet.placement``).

Stdlib only: importing this module never boots Django.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Violation:
    """One broken rule, with a stable machine-readable code such as ``mig.overlap``.

    Attributes:
        code: stable identifier, ``<package>.<rule>``; clients branch on it.
        message: a sentence for people.
        details: JSON-serialisable facts about the violation (profile, start, ...).
    """

    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": dict(self.details)}
