"""Formatting for the dashboard: sizes, percentages and "n/a" where NVML has no value."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

from fleet.web.presenters import format_mib, format_mib_pair
from fleet.web.reasons import named_gpus

register = template.Library()


@register.filter
def mib(value: Any) -> str:
    return format_mib(value if isinstance(value, int | float) else None)


@register.filter
def pct(value: Any) -> str:
    return f"{float(value):.0f}%" if isinstance(value, int | float) else "n/a"


@register.filter
def num(value: Any, unit: str = "") -> str:
    if not isinstance(value, int | float):
        return "n/a"
    return f"{float(value):.0f}{unit}"


@register.filter
def ago(value: datetime | None) -> str:
    if value is None:
        return "never"
    seconds = (timezone.now() - value).total_seconds()
    if seconds < 60:
        return f"{max(0, int(seconds))}s ago"
    return f"{timesince(value).split(',')[0]} ago"


@register.filter
def took(operation: Any) -> str:
    """How long an operation took (or has been running), e.g. ``1.4 s``."""
    end = operation.finished_at
    if end is None:
        return "running" if operation.dispatched_at else "—"
    seconds = max(0.0, (end - operation.created_at).total_seconds())
    return f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


@register.filter
def mib_of(used: Any, total: Any) -> str:
    used_value = float(used) if isinstance(used, int | float) else None
    return format_mib_pair(used_value, float(total) if isinstance(total, int | float) else 0.0)


@register.filter
def gpu_named(text: Any, operation: Any) -> str:
    """``text`` (an operation's summary or reason) with its GPU named as the pages name it
    (``a100-b01/gpu0``) where the engine wrote "GPU 33"."""
    gpu, host = getattr(operation, "gpu", None), getattr(operation, "host", None)
    if gpu is None or host is None or not text:
        return str(text or "")
    name = f"{host.name}/gpu{gpu.index}"
    return named_gpus(str(text), lambda pk: name if pk == gpu.pk else None)
