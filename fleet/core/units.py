"""Quantities in words, as people read them: in the dashboard and in the audit trail."""

from __future__ import annotations


def format_mib(mib: float | None) -> str:
    """``"80 GiB"``, ``"1.5 GiB"``, ``"512 MiB"``; ``"n/a"`` without a value."""
    if mib is None:
        return "n/a"
    gib = float(mib) / 1024
    if gib >= 100:
        return f"{gib:.0f} GiB"
    if gib >= 1:
        return f"{gib:.1f} GiB".replace(".0 GiB", " GiB")
    return f"{float(mib):.0f} MiB"
