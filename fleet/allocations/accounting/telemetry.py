"""Per-replica metrics: the 1 s points of the last hour in the telemetry store, per-minute means
in ``ReplicaSample`` rows for a week, and the series one replica shows for a window.

The points are derived at ingest from the ticks the agents already send
(:func:`fleet.agents.gpu_maps.replica_ticks`); the rollup and retention run in the same beat tasks
as the GPUs'. ``None`` is kept as ``None`` (no value that second), never turned into 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Literal, TypedDict

from django.utils import timezone

from fleet.allocations.models import Allocation, ReplicaSample, RequestKind
from fleet.inventory.models import Host
from fleet.inventory.telemetry import (
    ROLLUP_SECONDS,
    ReplicaPoint,
    TelemetryStore,
    get_store,
    keep_seconds,
    mean_replica_points,
    store_raw_seconds,
    unpack_replicas,
)
from fleet.inventory.telemetry.stores import minutes_to_roll_up

ROLLUP_MARK = "replica_rollup"
MAX_POINTS = 720
WINDOWS: dict[str, int] = {"1h": 3600, "24h": 86_400, "7d": 7 * 86_400}

Source = Literal["mig_instance", "processes", "gpu"]
SOURCES: dict[str, Source] = {
    RequestKind.MIG: "mig_instance",
    RequestKind.MPS: "processes",
    RequestKind.GPU: "gpu",
}


class ReplicaSeries(TypedDict):
    """``GET /api/v1/allocations/{id}/metrics``: a replica's points over a window."""

    allocation: int
    window: str
    bucket_s: int
    points: list[ReplicaPoint]
    source: Source


def bucket_seconds(window_s: int) -> int:
    """The bucket that keeps a window at :data:`MAX_POINTS` points at most (whole minutes
    beyond an hour, where the points are per-minute means)."""
    bucket = math.ceil(window_s / MAX_POINTS)
    return bucket if window_s <= 3600 else math.ceil(bucket / ROLLUP_SECONDS) * ROLLUP_SECONDS


def replica_series(
    allocation: Allocation, *, window: str, now: float | None = None
) -> ReplicaSeries:
    """The replica's means per bucket over ``window`` (a :data:`WINDOWS` key), oldest first.

    1h: the 1 s points of the hot store; longer: the per-minute means, and for the minutes the
    rollup has not reached yet, means of the hot store's points. ``KeyError`` for another
    window."""
    window_s = WINDOWS[window]
    now = time.time() if now is None else now
    bucket_s = bucket_seconds(window_s)
    since = (math.floor(now / bucket_s) - MAX_POINTS + 1) * bucket_s
    store = get_store()
    host_id = int(allocation.gpu.host_id)
    raw_s = store_raw_seconds(store)
    if window_s <= raw_s:
        points = _raw_points(store, host_id, allocation.pk, since, now)
    else:
        points = _minute_points(allocation.pk, since)
        after = points[-1]["ts"] + ROLLUP_SECONDS if points else since
        recent = _raw_points(store, host_id, allocation.pk, max(after, now - raw_s), now)
        points += mean_replica_points(recent, ROLLUP_SECONDS)
    return ReplicaSeries(
        allocation=allocation.pk,
        window=window,
        bucket_s=bucket_s,
        points=[_rounded(p) for p in mean_replica_points(points, bucket_s)],
        source=SOURCES.get(allocation.kind, "processes"),
    )


def _rounded(point: ReplicaPoint) -> ReplicaPoint:
    util, memory = point["utilization_percent"], point["memory_used_mib"]
    return ReplicaPoint(
        ts=point["ts"],
        utilization_percent=None if util is None else round(util, 1),
        memory_used_mib=None if memory is None else round(memory, 1),
    )


def _minute_points(allocation_id: int, since: float) -> list[ReplicaPoint]:
    rows = (
        ReplicaSample.objects.filter(
            allocation_id=allocation_id, ts__gte=datetime.fromtimestamp(since, tz=UTC)
        )
        .order_by("ts")
        .values_list("ts", "utilization_percent", "memory_used_mib")
    )  # a week is 10,080 rows: tuples, not model instances
    return [
        ReplicaPoint(ts=ts.timestamp(), utilization_percent=util, memory_used_mib=memory)
        for ts, util, memory in rows
    ]


def _raw_points(
    store: TelemetryStore, host_id: int, allocation_id: int, since: float, until: float
) -> list[ReplicaPoint]:
    points: list[ReplicaPoint] = []
    for minute in range(int(since // ROLLUP_SECONDS), int(until // ROLLUP_SECONDS) + 1):
        data = store.replica_buckets([host_id], minute).get(host_id)
        if data:
            points.extend(
                p
                for _, p in unpack_replicas(minute, data, allocation_id)
                if since <= p["ts"] <= until
            )
    points.sort(key=lambda p: p["ts"])
    return points


def replica_rollup(now: float | None = None) -> int:
    """Per-minute means of every closed minute not yet rolled up -> ``ReplicaSample`` rows.

    Idempotent (a repeated minute is ignored by the unique constraint) and bounded: at most the
    minutes still in the raw window. Points of replicas that no longer exist are dropped.
    Returns rows written."""
    store = get_store()
    minutes = minutes_to_roll_up(store, ROLLUP_MARK, time.time() if now is None else now)
    host_ids = list(Host.objects.values_list("pk", flat=True))
    existing = set(Allocation.objects.values_list("pk", flat=True))
    written = 0
    for minute in minutes:
        rows = _minute_rows(store.replica_buckets(host_ids, minute).values(), minute, existing)
        ReplicaSample.objects.bulk_create(rows, ignore_conflicts=True, batch_size=1000)
        written += len(rows)
        store.set_mark(ROLLUP_MARK, minute)
    return written


def _minute_rows(buckets: Iterable[bytes], minute: int, existing: set[int]) -> list[ReplicaSample]:
    by_replica: dict[int, list[ReplicaPoint]] = {}
    for data in buckets:
        for allocation_id, point in unpack_replicas(minute, data):
            if allocation_id in existing:
                by_replica.setdefault(allocation_id, []).append(point)
    ts = datetime.fromtimestamp(minute * ROLLUP_SECONDS, tz=UTC)
    rows = []
    for allocation_id, points in by_replica.items():
        (mean,) = mean_replica_points(points, ROLLUP_SECONDS)
        rows.append(
            ReplicaSample(
                allocation_id=allocation_id,
                ts=ts,
                utilization_percent=mean["utilization_percent"],
                memory_used_mib=mean["memory_used_mib"],
            )
        )
    return rows


def replica_retention(now: datetime | None = None) -> int:
    """Delete per-minute replica points past ``FLEET_TELEMETRY_KEEP_SECONDS`` (a week)."""
    now = now or timezone.now()
    deleted, _ = ReplicaSample.objects.filter(
        ts__lt=now - timedelta(seconds=keep_seconds())
    ).delete()
    return deleted
