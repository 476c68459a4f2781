"""Reads of observed state that do not come from a single row: latest telemetry and history.

Telemetry lives in the hot store (:mod:`fleet.inventory.telemetry`: Redis, or process memory in
the embedded mode) for the last hour at 1 s, and in ``TelemetrySample(resolution_s=60)`` rows for
a week. ``None`` is kept as ``None`` (NVML had no value), never turned into 0.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from fleet.inventory import telemetry
from fleet.inventory.models import Gpu, TelemetrySample
from fleet.inventory.telemetry import ROLLUP_SECONDS, Latest, Point


def latest_telemetry(gpu_ids: Iterable[int]) -> dict[int, Latest]:
    """The latest sample of each GPU that has one: ``{gpu id: {"ts", "received_at", "sample"}}``.

    ``sample`` is the agent's sample as sent (``utilization_gpu_percent``, ``power_mw``,
    ``processes``, ``mig`` …); ``ts`` is the agent's clock, ``received_at`` the server's (Unix
    seconds). One round trip for any number of GPUs.
    """
    return telemetry.get_store().latest(int(g) for g in gpu_ids)


def latest_telemetry_of(gpus: Iterable[Gpu]) -> dict[int, tuple[dict[str, Any], datetime | None]]:
    """``{gpu id: (sample, received at)}`` for rows: the hot store first, else the checkpoint
    in ``Gpu.last_telemetry`` (after a Redis restart, or for a GPU with no recent tick)."""
    rows = list(gpus)
    hot = latest_telemetry(g.pk for g in rows)
    out: dict[int, tuple[dict[str, Any], datetime | None]] = {}
    for gpu in rows:
        found = hot.get(gpu.pk)
        if found is not None:
            out[gpu.pk] = (
                found["sample"],
                datetime.fromtimestamp(found["received_at"], tz=UTC),
            )
        else:
            sample = gpu.last_telemetry if isinstance(gpu.last_telemetry, dict) else {}
            out[gpu.pk] = (sample, gpu.last_telemetry_at)
    return out


def gpu_history(gpu_id: int, *, seconds: int, now: float | None = None) -> list[Point]:
    """The GPU's points of the last ``seconds``, oldest first.

    Up to the raw window (``FLEET_TELEMETRY_RAW_SECONDS``, an hour): 1 s points (the mean of a
    second's samples when an agent reports faster). Beyond: 60 s means from PostgreSQL, and for
    the minutes the rollup has not reached yet, means computed from the raw points.
    """
    now = time.time() if now is None else now
    since = now - seconds
    host_id = Gpu.objects.filter(pk=gpu_id).values_list("host_id", flat=True).first()
    if host_id is None:
        return []
    store = telemetry.get_store()
    raw_window = telemetry.store_raw_seconds(store)
    if seconds <= raw_window:
        return telemetry.mean_points(_raw_points(store, host_id, gpu_id, since, now), 1)
    rows = list(
        TelemetrySample.objects.filter(
            gpu_id=gpu_id,
            resolution_s=ROLLUP_SECONDS,
            ts__gte=datetime.fromtimestamp(since, tz=UTC),
        )
        .order_by("ts")
        .values("ts", *telemetry.METRICS)
    )
    points = [
        Point(
            ts=row["ts"].timestamp(),
            utilization_percent=row["utilization_percent"],
            memory_used_mib=row["memory_used_mib"],
            temperature_c=row["temperature_c"],
            power_w=row["power_w"],
        )
        for row in rows
    ]
    after = points[-1]["ts"] + ROLLUP_SECONDS if points else since
    recent = _raw_points(store, host_id, gpu_id, max(after, now - raw_window), now)
    return points + telemetry.mean_points(recent, ROLLUP_SECONDS)


def _raw_points(
    store: telemetry.TelemetryStore, host_id: int, gpu_id: int, since: float, until: float
) -> list[Point]:
    points: list[Point] = []
    for minute in range(int(since // ROLLUP_SECONDS), int(until // ROLLUP_SECONDS) + 1):
        data = store.raw_buckets([host_id], minute).get(host_id)
        if data:
            points.extend(
                p for _, p in telemetry.unpack(minute, data, gpu_id) if since <= p["ts"] <= until
            )
    points.sort(key=lambda p: p["ts"])
    return points


# The windows a GPU's history is served for, and the most points one answer holds.
HISTORY_WINDOWS = {"1h": 3600, "24h": 86400, "7d": 7 * 86400}
HISTORY_MAX_POINTS = 720  # as a replica's series (fleet.allocations.accounting.telemetry)


def gpu_history_series(
    gpu_id: int, *, seconds: int, max_points: int = HISTORY_MAX_POINTS, now: float | None = None
) -> tuple[int, list[Point]]:
    """The last ``seconds`` of the GPU's telemetry in at most ``max_points`` buckets of equal
    size (returned with them): every bucket of the window is there, its values the means of the
    points kept in it, ``None`` where none had a value.

    Past the raw window the buckets are whole minutes (the per-minute means they are made of).
    """
    now = time.time() if now is None else now
    bucket_s = max(1, -(-seconds // max_points))
    if seconds > telemetry.store_raw_seconds(telemetry.get_store()):
        bucket_s = -(-bucket_s // ROLLUP_SECONDS) * ROLLUP_SECONDS
    means = telemetry.mean_points(gpu_history(gpu_id, seconds=seconds, now=now), bucket_s)
    by_bucket = {int(p["ts"] // bucket_s): p for p in means}
    last = int(now // bucket_s)
    first = last - seconds // bucket_s + 1
    empty = dict.fromkeys(telemetry.METRICS)
    return bucket_s, [
        by_bucket.get(i) or Point(ts=float(i * bucket_s), **empty)  # type: ignore[typeddict-item]
        for i in range(first, last + 1)
    ]
