"""``GET /api/v1/gpus/{id}/history``: the kept telemetry over 1 h, 24 h or 7 d in a bounded number
of equal buckets, ``null`` where there is no value (never 0), for any role."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from fleet.inventory.models import TelemetrySample
from fleet.inventory.selectors import HISTORY_MAX_POINTS
from fleet.inventory.telemetry import GpuTick
from tests.factories import GpuFactory
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


def tick(gpu_id: int, util: float | None) -> GpuTick:
    return GpuTick(
        gpu_id=gpu_id,
        utilization_percent=util,
        memory_used_mib=2048.0,
        temperature_c=None,
        power_w=300.0,
        sample={},
    )


def test_the_last_hour_is_bounded_and_keeps_missing_values_null(viewer_client, mem_store):
    gpu = GpuFactory()
    now = time.time()
    for s in range(30):
        mem_store.record(
            host_id=gpu.host_id, ts=now - 30 + s, received_at=now, ticks=[tick(gpu.pk, 40.0)]
        )
    body = viewer_client.get(f"/api/v1/gpus/{gpu.pk}/history?window=1h").json()
    assert body["gpu"] == gpu.pk and body["window"] == "1h"
    assert body["bucket_s"] == 3600 // HISTORY_MAX_POINTS
    points = body["points"]
    assert len(points) == HISTORY_MAX_POINTS
    assert [p["t"] for p in points] == sorted(p["t"] for p in points)
    filled = [p for p in points if p["utilization_percent"] is not None]
    assert filled and all(p["utilization_percent"] == 40.0 for p in filled)
    assert all(p["temperature_c"] is None for p in points)  # never reported: null, not 0
    assert points[0]["utilization_percent"] is None  # no sample half an hour ago


@pytest.mark.parametrize(("window", "seconds"), [("24h", 86400), ("7d", 7 * 86400)])
def test_longer_windows_serve_the_minute_means_in_whole_minute_buckets(
    viewer_client, mem_store, window, seconds
):
    gpu = GpuFactory()
    then = time.time() - seconds / 2
    TelemetrySample.objects.create(
        gpu=gpu,
        ts=datetime.fromtimestamp(then - then % 60, tz=UTC),
        resolution_s=60,
        utilization_percent=None,
        temperature_c=55.0,
    )
    body = viewer_client.get(f"/api/v1/gpus/{gpu.pk}/history?window={window}").json()
    assert body["bucket_s"] % 60 == 0
    assert len(body["points"]) <= HISTORY_MAX_POINTS
    (kept,) = [p for p in body["points"] if p["temperature_c"] is not None]
    assert kept["temperature_c"] == 55.0 and kept["utilization_percent"] is None


def test_an_unknown_window_is_a_400_and_an_unknown_gpu_a_404(viewer_client):
    gpu = GpuFactory()
    assert_error(viewer_client.get(f"/api/v1/gpus/{gpu.pk}/history?window=30d"), 400)
    assert_error(viewer_client.get("/api/v1/gpus/999999/history"), 404)


def test_history_needs_a_role(anon_client):
    gpu = GpuFactory()
    assert_error(anon_client.get(f"/api/v1/gpus/{gpu.pk}/history"), 401)
