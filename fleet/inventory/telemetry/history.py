"""Rollup and retention (Celery beat): per-minute means of the hot store's 1 s points become
``TelemetrySample`` rows kept a week; the latest samples are checkpointed on the GPU rows."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.utils import timezone

from fleet.core.locking import lock_available
from fleet.inventory.models import Gpu, Host, TelemetrySample
from fleet.inventory.telemetry.codec import (
    ROLLUP_SECONDS,
    Point,
    keep_seconds,
    mean_points,
    raw_seconds,
    unpack,
)
from fleet.inventory.telemetry.stores import (
    get_store,
    minutes_to_roll_up,
)

ROLLUP_MARK = "rollup"


CHECKPOINT_BATCH = 500


def rollup(now: float | None = None) -> int:
    """Per-minute means of every closed minute not yet rolled up -> ``TelemetrySample(60)``.

    Idempotent (a repeated minute is ignored by the unique constraint) and bounded: at most the
    minutes still in the raw window. Also checkpoints the latest samples into
    ``Gpu.last_telemetry`` so the database keeps the last known values. Returns rows written.
    """

    now = time.time() if now is None else now
    store = get_store()
    minutes = minutes_to_roll_up(store, ROLLUP_MARK, now)
    host_ids = list(Host.objects.values_list("pk", flat=True))
    gpu_ids = set(Gpu.objects.values_list("pk", flat=True))
    written = 0
    for minute in minutes:
        rows = []
        for data in store.raw_buckets(host_ids, minute).values():
            by_gpu: dict[int, list[Point]] = {}
            for gid, point in unpack(minute, data):
                by_gpu.setdefault(gid, []).append(point)
            for gid, points in by_gpu.items():
                if gid not in gpu_ids:
                    continue
                (mean,) = mean_points(points, ROLLUP_SECONDS)
                rows.append(
                    TelemetrySample(
                        gpu_id=gid,
                        ts=datetime.fromtimestamp(minute * ROLLUP_SECONDS, tz=UTC),
                        resolution_s=ROLLUP_SECONDS,
                        utilization_percent=mean["utilization_percent"],
                        memory_used_mib=mean["memory_used_mib"],
                        temperature_c=mean["temperature_c"],
                        power_w=mean["power_w"],
                    )
                )
        TelemetrySample.objects.bulk_create(rows, ignore_conflicts=True, batch_size=1000)
        written += len(rows)
        store.set_mark(ROLLUP_MARK, minute)
    checkpoint_latest(gpu_ids)
    return written


def checkpoint_latest(gpu_ids: set[int] | None = None) -> int:
    """Copy the latest samples into ``Gpu.last_telemetry`` (the durable last known values)."""

    store = get_store()
    latest = store.all_latest()
    if gpu_ids is not None:
        gone = [g for g in latest if g not in gpu_ids]
        store.forget_latest(gone)
        latest = {g: v for g, v in latest.items() if g in gpu_ids}
    written = 0
    ids = sorted(latest)
    for start in range(0, len(ids), CHECKPOINT_BATCH):
        # One short transaction per batch, taking only the GPU rows no drain or placement
        # holds: a checkpoint never waits for (nor deadlocks with) the control plane; a row it
        # skips is written at the next one.
        with transaction.atomic():
            free = lock_available(Gpu, ids[start : start + CHECKPOINT_BATCH])
            rows = [
                Gpu(
                    pk=gid,
                    last_telemetry=latest[gid]["sample"],
                    last_telemetry_at=datetime.fromtimestamp(latest[gid]["received_at"], tz=UTC),
                )
                for gid in free
            ]
            Gpu.objects.bulk_update(rows, ["last_telemetry", "last_telemetry_at"])
            written += len(rows)
    return written


def retention(now: datetime | None = None) -> int:
    """Delete 60 s points past the week and 1 s rows past the hour; returns rows deleted."""

    now = now or timezone.now()
    minutes, _ = TelemetrySample.objects.filter(
        resolution_s=ROLLUP_SECONDS, ts__lt=now - timedelta(seconds=keep_seconds())
    ).delete()
    seconds, _ = TelemetrySample.objects.filter(
        resolution_s=1, ts__lt=now - timedelta(seconds=raw_seconds())
    ).delete()
    return minutes + seconds
