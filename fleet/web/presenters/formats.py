"""Numbers as the dashboard shows them: heat buckets, memory sizes, utilisation values."""

from __future__ import annotations

from typing import Any

from fleet.core.units import format_mib

__all__ = ["format_mib"]  # where the dashboard's modules find it

NA_TITLE = "Not available (NVML reports no utilisation for MIG instances on this GPU)"


def heat_bucket(utilization_percent: float | None) -> str:
    """The heat-scale step (``"0"`` … ``"10"``) the CSS colours, or ``"na"`` without a value."""
    if utilization_percent is None:
        return "na"
    return str(max(0, min(10, round(float(utilization_percent) / 10))))


def number(raw: Any) -> float | None:
    return float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None


def utilization_value(raw: Any) -> float | None:
    """A utilisation as stored or sent (a number, or the text SQL extracts from JSON), or
    ``None`` where there is none or it is not a number."""
    if isinstance(raw, str):
        try:
            return float(raw)
        except ValueError:
            return None
    return number(raw)


def format_mib_pair(used: float | None, total: float) -> str:
    """``17.2/79.6 GiB``: used of total in one unit (compact enough for a card's footer)."""
    if used is None:
        return f"n/a of {format_mib(total)}"
    if total >= 1024:
        return f"{used / 1024:.1f}/{total / 1024:.1f} GiB".replace(".0/", "/").replace(
            ".0 GiB", " GiB"
        )
    return f"{used:.0f}/{total:.0f} MiB"
