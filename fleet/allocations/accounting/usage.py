"""Usage and chargeback: how long each allocation held what, and the sums per team, deployment
or product over a window.

Every allocation row opens a :class:`~fleet.allocations.models.UsageInterval` when it is created
and closes it when it is deleted (``post_save``/``post_delete`` receivers, connected in the app's
``ready``). Django sends ``post_delete`` per row for ``instance.delete()``, ``queryset.delete()``
and cascades (receivers turn off its fast path), so every end is recorded whoever deletes the row.
An allocation counts from its creation (pending) to its deletion, releasing time included: the
capacity is reserved all that time.

Units, per interval clipped to ``[start, end)`` (an open interval ends at ``min(now, end)``):

* MIG: compute-slice-hours (the profile's ``g``); GPU-equivalent: slices / the GPU's slices
  (7 on an H100), or its memory share when the product is unknown.
* MPS: GiB-hours of reserved memory and compute-%-hours of the cap (an uncapped share adds no
  compute-%-hours); GPU-equivalent: the larger of its memory share and its compute share, an
  uncapped share counting its memory share only (the cap is what it reserved; uncapped clients
  compete for what is left).
* Whole GPUs: GPU-hours (one row per GPU); GPU-equivalent: 1 per GPU.

Borrowed allocations (past their team's deserved share) add their GPU-equivalent hours to
``borrowed_gpu_equivalent_hours`` too: the guaranteed hours are the difference.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from fleet.allocations.models import Allocation, RequestKind, UsageInterval
from fleet.core.errors import ServiceError
from fleet.mig.catalog import find_product, product_by_key

GROUPS = ("team", "deployment", "product")
DEFAULT_WINDOW = timedelta(hours=24)
MAX_WINDOW = timedelta(days=400)
UNITS = (
    "mig_slice_hours",
    "mps_gib_hours",
    "mps_compute_percent_hours",
    "gpu_hours",
    "gpu_equivalent_hours",
    "borrowed_gpu_equivalent_hours",
)


def interval_fields(allocation: Any, started_at: datetime) -> dict[str, Any]:
    """The fields of the interval an allocation opens: its deployment, team, GPU and request
    (also called by the migration that opens intervals for existing rows, on its models)."""
    deployment = allocation.deployment
    gpu = allocation.gpu
    product = product_by_key(gpu.product_key) if gpu.product_key else None
    product = product or find_product(name=gpu.product_name)
    interval: dict[str, Any] = {
        "allocation_id": allocation.pk,
        "deployment_id": deployment.pk,
        "deployment_name": deployment.name,
        "team_id": deployment.team_id,
        "team_name": deployment.team.name if deployment.team_id else "",
        "replica": allocation.replica,
        "kind": allocation.kind,
        "product_key": gpu.product_key,
        "product_name": gpu.product_name,
        "gpu_id": gpu.pk,
        "gpu_memory_mib": gpu.memory_mib,
        "memory_mib": allocation.memory_mib,
        "borrowed": bool(getattr(allocation, "borrowed", False)),
        "started_at": started_at,
    }
    if allocation.kind == RequestKind.MIG:
        partition = allocation.partition
        interval["profile"] = partition.profile_name
        found = None
        if product is not None and partition.profile_id is not None:
            found = product.profile(partition.profile_id)
        if product is not None and found is None and partition.profile_name:
            found = product.profile(partition.profile_name)
        interval["compute_slices"] = found.compute_slices if found else None
        slices = product.compute_slice_count if product else 0
        interval["gpu_compute_slices"] = slices or None
    elif allocation.kind == RequestKind.MPS:
        interval["compute_percent"] = allocation.compute_percent
    else:
        interval["gpu_count"] = 1
    return interval


def open_interval(sender: Any, instance: Allocation, created: bool, raw: bool, **_: Any) -> None:
    if created and not raw:
        UsageInterval.objects.create(**interval_fields(instance, timezone.now()))


def close_interval(sender: Any, instance: Allocation, **_: Any) -> None:
    UsageInterval.objects.filter(allocation_id=instance.pk, ended_at__isnull=True).update(
        ended_at=timezone.now()
    )


# --- sums -------------------------------------------------------------------------------------


def rates(interval: UsageInterval) -> dict[str, float]:
    """What one hour of the interval adds to each unit."""
    out = dict.fromkeys(UNITS, 0.0)
    gpu_memory = interval.gpu_memory_mib or 1
    memory_share = (interval.memory_mib or 0) / gpu_memory
    if interval.kind == RequestKind.MIG:
        slices = interval.compute_slices or 0
        out["mig_slice_hours"] = float(slices)
        if slices and interval.gpu_compute_slices:
            out["gpu_equivalent_hours"] = slices / interval.gpu_compute_slices
        else:
            out["gpu_equivalent_hours"] = memory_share
    elif interval.kind == RequestKind.MPS:
        out["mps_gib_hours"] = (interval.memory_mib or 0) / 1024
        cap = interval.compute_percent
        out["mps_compute_percent_hours"] = float(cap or 0)
        out["gpu_equivalent_hours"] = max(memory_share, (cap or 0) / 100)
    else:
        count = interval.gpu_count or 1
        out["gpu_hours"] = float(count)
        out["gpu_equivalent_hours"] = float(count)
    if interval.borrowed:
        out["borrowed_gpu_equivalent_hours"] = out["gpu_equivalent_hours"]
    return out


def hours_within(interval: UsageInterval, start: datetime, end: datetime, now: datetime) -> float:
    """Hours of the interval inside ``[start, end)``; an open one runs until ``min(now, end)``."""
    stop = interval.ended_at if interval.ended_at is not None else min(now, end)
    lo, hi = max(interval.started_at, start), min(stop, end)
    return max((hi - lo).total_seconds(), 0.0) / 3600


def group_of(interval: UsageInterval, group_by: str) -> tuple[Any, str]:
    if group_by == "team":
        return interval.team_id, interval.team_name
    if group_by == "deployment":
        return interval.deployment_id, interval.deployment_name
    return interval.product_key or interval.product_name, interval.product_name


def overlapping(start: datetime, end: datetime) -> Iterator[UsageInterval]:
    return (
        UsageInterval.objects.filter(started_at__lt=end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=start))
        .order_by("id")
        .iterator(chunk_size=2000)
    )


@dataclass
class Window:
    start: datetime
    end: datetime
    group_by: str = "team"
    now: datetime = field(default_factory=timezone.now)


def usage_window(
    start: datetime | None, end: datetime | None, group_by: str | None, now: datetime | None = None
) -> Window:
    """The checked window: defaults to the last 24 h, at most 400 days, ``start < end``."""
    now = now or timezone.now()
    group = group_by or "team"
    if group not in GROUPS:
        raise ServiceError(
            "usage.bad_group_by",
            f"group_by must be one of {', '.join(GROUPS)}.",
            {"group_by": group, "allowed": list(GROUPS)},
        )
    end = end or now
    start = start or end - DEFAULT_WINDOW
    if start >= end:
        raise ServiceError(
            "usage.bad_window",
            "from must be before to.",
            {"from": start.isoformat(), "to": end.isoformat()},
        )
    if end - start > MAX_WINDOW:
        raise ServiceError(
            "usage.window_too_long",
            "The window is at most 400 days.",
            {"from": start.isoformat(), "to": end.isoformat(), "max_days": 400},
        )
    return Window(start, end, group, now)


def _sums(intervals: Iterable[UsageInterval], window: Window) -> list[dict[str, Any]]:
    groups: dict[Any, dict[str, Any]] = {}
    for interval in intervals:
        hours = hours_within(interval, window.start, window.end, window.now)
        if hours <= 0:
            continue
        key, name = group_of(interval, window.group_by)
        row = groups.setdefault(key, {"key": key, "name": name, **dict.fromkeys(UNITS, 0.0)})
        for unit, rate in rates(interval).items():
            row[unit] += rate * hours
    return list(groups.values())


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, **{u: round(row[u], 6) for u in UNITS}}


def summarize(intervals: Iterable[UsageInterval], window: Window) -> list[dict[str, Any]]:
    """One row per group with every unit, largest GPU-equivalent first."""
    rows = [_rounded(row) for row in _sums(intervals, window)]
    rows.sort(key=lambda r: (-r["gpu_equivalent_hours"], str(r["name"])))
    return rows


def usage_report(window: Window) -> dict[str, Any]:
    sums = _sums(overlapping(window.start, window.end), window)
    rows = sorted(
        (_rounded(row) for row in sums), key=lambda r: (-r["gpu_equivalent_hours"], str(r["name"]))
    )
    totals = _rounded({u: sum(row[u] for row in sums) for u in UNITS})
    return {
        "from": window.start,
        "to": window.end,
        "group_by": window.group_by,
        "groups": rows,
        "totals": totals,
    }


def bucket_seconds(window: Window, most: int = 200) -> int:
    """Hourly buckets, wider (whole hours) when the window would need more than ``most``."""
    seconds = (window.end - window.start).total_seconds()
    return 3600 * max(1, math.ceil(seconds / 3600 / most))


def timeline(window: Window) -> tuple[list[datetime], dict[str, list[float]]]:
    """Mean GPU-equivalents held per team in each bucket of the window (for the usage chart)."""
    step = bucket_seconds(window)
    count = math.ceil((window.end - window.start).total_seconds() / step)
    starts = [window.start + timedelta(seconds=step * i) for i in range(count)]
    series: dict[str, list[float]] = {}
    for interval in overlapping(window.start, window.end):
        rate = rates(interval)["gpu_equivalent_hours"]
        stop = interval.ended_at if interval.ended_at is not None else window.now
        lo = max(interval.started_at, window.start)
        hi = min(stop, window.end)
        if hi <= lo:
            continue
        values = series.setdefault(interval.team_name or "(none)", [0.0] * count)
        first = int((lo - window.start).total_seconds() // step)
        last = min(count - 1, int((hi - window.start).total_seconds() // step))
        for i in range(first, last + 1):
            b_lo = starts[i]
            b_hi = min(b_lo + timedelta(seconds=step), window.end)
            overlap = (min(hi, b_hi) - max(lo, b_lo)).total_seconds()
            if overlap > 0:
                values[i] += rate * overlap / (b_hi - b_lo).total_seconds()
    return starts, dict(sorted(series.items()))
