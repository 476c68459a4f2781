"""Telemetry storage: the hot store (memory, and Redis when FLEET_REDIS_URL is set) behaves the
same, history has 1 s points for an hour and 60 s points beyond, ``None`` stays ``None``, and the
rollup and retention keep PostgreSQL bounded."""

from __future__ import annotations

import itertools
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.agents.reports import agent_telemetry
from fleet.inventory import selectors, telemetry
from fleet.inventory.models import Gpu, Host, TelemetrySample
from fleet.inventory.telemetry import GpuTick, MemoryStore, RedisStore
from fleet.inventory.telemetry import stores as telemetry_stores

pytestmark = pytest.mark.django_db

MINUTE = 60


def tick(gpu_id: int, util: float | None, temp: float | None = 40.0) -> GpuTick:
    return GpuTick(
        gpu_id=gpu_id,
        utilization_percent=util,
        memory_used_mib=1024.0,
        temperature_c=temp,
        power_w=None,
        sample={"utilization_gpu_percent": util},
    )


def stores() -> list[Any]:
    found: list[Any] = [pytest.param(lambda: MemoryStore(3600), id="memory")]
    url = os.environ.get("FLEET_REDIS_URL", "")
    found.append(
        pytest.param(
            lambda: RedisStore(url, f"fleet:tel:test-{os.getpid()}:", 3600),
            id="redis",
            marks=pytest.mark.skipif(not url, reason="FLEET_REDIS_URL is not set"),
        )
    )
    return found


@pytest.fixture(params=stores())
def store(request):
    made = request.param()
    made.clear()
    yield made
    made.clear()


def test_pack_round_trips_and_keeps_none():
    ts = 1_800_000_000 * 1.0 + 12.345
    data = telemetry.pack(ts, [tick(7, 55.5), tick(8, None, temp=None)])
    points = telemetry.unpack(int(ts // MINUTE), data)
    assert [g for g, _ in points] == [7, 8]
    first, second = points[0][1], points[1][1]
    assert first["ts"] == pytest.approx(ts, abs=0.001)
    assert first["utilization_percent"] == 55.5 and first["power_w"] is None
    assert second["utilization_percent"] is None and second["temperature_c"] is None
    assert second["memory_used_mib"] == 1024.0


def test_means_ignore_missing_values_and_stay_none_without_any():
    points = [
        telemetry.Point(
            ts=60.0, utilization_percent=10.0, memory_used_mib=None, temperature_c=1, power_w=None
        ),
        telemetry.Point(
            ts=61.0, utilization_percent=None, memory_used_mib=None, temperature_c=3, power_w=None
        ),
    ]
    (mean,) = telemetry.mean_points(points, MINUTE)
    assert mean == {
        "ts": 60.0,
        "utilization_percent": 10.0,
        "memory_used_mib": None,
        "temperature_c": 2.0,
        "power_w": None,
    }


def test_stores_keep_latest_and_minute_buckets(store):
    now = 1_800_000_000.0
    store.record(host_id=1, ts=now, received_at=now + 0.1, ticks=[tick(11, 1.0), tick(12, 2.0)])
    store.record(host_id=1, ts=now + 1, received_at=now + 1.1, ticks=[tick(11, 3.0)])
    latest = store.latest([11, 12, 13])
    assert set(latest) == {11, 12}
    assert latest[11]["ts"] == now + 1 and latest[11]["sample"] == {"utilization_gpu_percent": 3.0}
    assert latest[12]["received_at"] == pytest.approx(now + 0.1)
    bucket = store.raw_buckets([1, 2], int(now // MINUTE))
    assert set(bucket) == {1}
    assert [g for g, _ in telemetry.unpack(int(now // MINUTE), bucket[1])] == [11, 12, 11]
    store.forget_latest([11])
    assert set(store.all_latest()) == {12}
    store.set_mark("x", 5)
    assert store.get_mark("x") == 5


@pytest.mark.skipif(not os.environ.get("FLEET_REDIS_URL"), reason="FLEET_REDIS_URL is not set")
def test_a_redis_bucket_gets_its_expiry_when_created_even_after_redis_forgot_it():
    store = RedisStore(os.environ["FLEET_REDIS_URL"], f"fleet:tel:ttl-{os.getpid()}:", 3600)
    store.clear()
    # Every tick in one minute (its first second: never across a minute's boundary), whatever
    # second of the minute the test runs in; the bucket lives until the end of the raw window
    # after that minute.
    minute = int(time.time() // MINUTE)
    now = minute * MINUTE + 0.1
    key = f"{store.prefix}raw:1:{minute}"
    expires_at = (minute + telemetry_stores.bucket_minutes(3600)) * MINUTE

    def expiry_s() -> float:
        left_ms = store.client.pttl(key)
        return left_ms / 1000 + time.time() if left_ms >= 0 else left_ms

    try:
        store.record(host_id=1, ts=now, received_at=now, ticks=[tick(11, 1.0)])
        assert expiry_s() == pytest.approx(expires_at, abs=1.0)
        assert expires_at - now >= 3600  # the raw window counted from the minute's end
        store.client.persist(key)  # as if the expiry had not been set: a later tick leaves it
        store.record(host_id=1, ts=now + 0.5, received_at=now, ticks=[tick(11, 2.0)])
        assert store.client.ttl(key) == -1
        store.client.delete(key)  # Redis restarted: the next tick creates the bucket again
        store.record(host_id=1, ts=now + 0.6, received_at=now, ticks=[tick(11, 3.0)])
        assert expiry_s() == pytest.approx(expires_at, abs=1.0)
    finally:
        store.clear()


def test_the_memory_store_forgets_buckets_past_the_raw_window(monkeypatch):
    store = MemoryStore(120)
    old = 1_800_000_000.0
    monkeypatch.setattr(telemetry_stores.time, "time", lambda: old)
    store.record(host_id=1, ts=old, received_at=old, ticks=[tick(1, 1.0)])
    later = old + 10 * MINUTE
    monkeypatch.setattr(telemetry_stores.time, "time", lambda: later)
    store.record(host_id=1, ts=later, received_at=later, ticks=[tick(1, 1.0)])
    assert store.raw_buckets([1], int(old // MINUTE)) == {}
    assert len(store._raw) == 1


@pytest.fixture
def gpu(db):
    host = Host.objects.create(name="h1")
    return Gpu.objects.create(
        host=host, index=0, uuid="GPU-1", product_name="NVIDIA H100", memory_mib=81920
    )


def sample(uuid: str, util: float | None) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "status": "ok",
        "utilization_gpu_percent": util,
        "memory_used_mib": 100,
        "memory_total_mib": 81920,
        "temperature_c": None,
        "power_mw": 250_000,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "processes": [],
        "mig": [],
    }


def test_agent_telemetry_writes_the_store_not_a_row_per_sample(gpu, mem_store):
    import time

    now = time.time()
    for i in range(3):
        stored = agent_telemetry(
            host=gpu.host,
            telemetry={"type": "telemetry", "ts": now - 2 + i, "gpus": [sample("GPU-1", 10.0 * i)]},
        )
        assert stored == 1
    assert not TelemetrySample.objects.exists()
    latest = selectors.latest_telemetry([gpu.pk])[gpu.pk]
    assert latest["sample"]["utilization_gpu_percent"] == 20.0
    history = selectors.gpu_history(gpu.pk, seconds=60, now=now + 1)
    assert [p["utilization_percent"] for p in history] == [0.0, 10.0, 20.0]
    assert all(p["temperature_c"] is None and p["power_w"] == 250.0 for p in history)
    assert Host.objects.get(pk=gpu.host_id).last_seen_at is not None
    (row_sample, _at) = selectors.latest_telemetry_of([gpu])[gpu.pk]
    assert row_sample["utilization_gpu_percent"] == 20.0


def test_history_is_1s_within_the_hour_and_60s_beyond(gpu, mem_store):
    now = 1_800_000_000.0 - 1_800_000_000.0 % MINUTE + 30  # half a minute into a minute
    host_id = gpu.host_id
    for s in range(150):  # 2.5 minutes at 1 s, two samples in the last second
        util = None if s % 10 == 0 else float(s % 7)
        mem_store.record(
            host_id=host_id, ts=now - 150 + s, received_at=now, ticks=[tick(gpu.pk, util)]
        )
    mem_store.record(host_id=host_id, ts=now - 0.5, received_at=now, ticks=[tick(gpu.pk, 6.0)])
    short = selectors.gpu_history(gpu.pk, seconds=60, now=now)
    assert len(short) == 60 and all(b["ts"] - a["ts"] == 1 for a, b in itertools.pairwise(short))
    assert short[0]["ts"] == now - 60
    assert any(p["utilization_percent"] is None for p in short)  # NVML had no value: not 0
    # An older rolled-up minute in PostgreSQL, beyond the raw window.
    TelemetrySample.objects.create(
        gpu=gpu,
        ts=datetime.fromtimestamp(now - 30 - 3 * 86400, tz=UTC),
        resolution_s=60,
        utilization_percent=None,
        temperature_c=50.0,
    )
    long = selectors.gpu_history(gpu.pk, seconds=7 * 86400, now=now)
    assert long[0]["utilization_percent"] is None and long[0]["temperature_c"] == 50.0
    assert all(p["ts"] % MINUTE == 0 for p in long)
    assert [p["ts"] for p in long[1:]] == [now - 30 - 120, now - 30 - 60, now - 30]


def test_rollup_writes_minute_means_once_and_retention_bounds_the_table(gpu, mem_store):
    now = 1_800_000_000.0 - 1_800_000_000.0 % MINUTE + 20
    for s in range(180):
        mem_store.record(
            host_id=gpu.host_id,
            ts=now - 200 + s,
            received_at=now,
            ticks=[tick(gpu.pk, 50.0, temp=None)],
        )
    written = telemetry.rollup(now=now)
    assert written == 3  # the three closed minutes that had points
    assert telemetry.rollup(now=now) == 0  # idempotent
    rows = list(TelemetrySample.objects.filter(gpu=gpu, resolution_s=60))
    assert len(rows) == 3
    assert all(r.utilization_percent == 50.0 and r.temperature_c is None for r in rows)
    gpu.refresh_from_db()
    assert gpu.last_telemetry == {"utilization_gpu_percent": 50.0}  # checkpointed
    TelemetrySample.objects.create(
        gpu=gpu, ts=datetime.now(tz=UTC) - timedelta(days=8), resolution_s=60
    )
    TelemetrySample.objects.create(
        gpu=gpu, ts=datetime.now(tz=UTC) - timedelta(hours=2), resolution_s=1
    )
    with override_settings(FLEET_TELEMETRY_KEEP_SECONDS=7 * 86400):
        assert telemetry.retention(now=datetime.fromtimestamp(now, tz=UTC) + timedelta(days=1)) == 2
    assert TelemetrySample.objects.count() == 3


_VALUES = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-10, max_value=7000),
)


@settings(max_examples=500, deadline=None)
@given(_VALUES, _VALUES, _VALUES, _VALUES)
def test_the_fast_packing_path_packs_exactly_as_the_careful_one(util, memory, temp, power):
    tick_ = GpuTick(3, util, memory, temp, power, {})
    careful = telemetry.codec.RECORD.pack(
        3,
        5,
        telemetry.codec._u16(util, 10),
        telemetry.codec._u32(memory),
        telemetry.codec._i16(temp),
        telemetry.codec._u16(power, 10),
    )
    assert telemetry.codec._point(tick_, 5) == careful
