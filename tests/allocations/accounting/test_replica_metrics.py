"""Per-replica metrics: derived at ingest from the ticks agents already send (a MIG replica from
its instance, MPS and whole-GPU replicas from their processes), stored 1 s for an hour in the hot
store (memory, and Redis when FLEET_REDIS_URL is set), rolled up into per-minute means kept a
week; ``None`` stays ``None``."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.agents import gpu_maps, ingest
from fleet.allocations.accounting.telemetry import (
    bucket_seconds,
    replica_retention,
    replica_rollup,
    replica_series,
)
from fleet.allocations.models import ReplicaSample
from fleet.inventory.telemetry import (
    HostRecord,
    MemoryStore,
    RedisStore,
    ReplicaTick,
    unpack_replicas,
)
from tests.allocations.replica_fleet import ReplicaFleet, busy_tick, gpu_sample, replica_fleet

pytestmark = pytest.mark.django_db

MINUTE = 60


@pytest.fixture
def fleet(mem_store: Any) -> ReplicaFleet:
    return replica_fleet()


def ingest_tick(f: ReplicaFleet, message: Any) -> None:
    ingest.ingest([ingest.Tick(f.host.pk, f.host.created_at.timestamp(), time.time(), message)])


def stored(store: Any, host_id: int, ts: float) -> dict[int, tuple[float | None, float | None]]:
    minute = int(ts // MINUTE)
    data = store.replica_buckets([host_id], minute).get(host_id, b"")
    return {
        aid: (p["utilization_percent"], p["memory_used_mib"])
        for aid, p in unpack_replicas(minute, data)
    }


def test_each_kind_of_replica_is_measured_from_the_tick(fleet, mem_store):
    now = time.time()
    ingest_tick(fleet, busy_tick(fleet, now))
    assert stored(mem_store, fleet.host.pk, now) == {
        fleet.mig.pk: (37.5, 9000.0),  # its MIG instance (GPM)
        fleet.mps_a.pk: (None, 1500.0),  # two processes; no utilisation per MPS client
        fleet.mps_b.pk: (None, 2048.0),
        fleet.whole.pk: (64.0, 30000.0),  # the GPU's utilisation, its processes' memory
    }


def test_a_tick_without_values_stores_none_never_zero(fleet, mem_store):
    now = time.time()
    empty = {
        "type": "telemetry",
        "ts": now,
        "gpus": [
            gpu_sample(g.uuid) for g in (fleet.mig_gpu, fleet.mps_gpu, fleet.whole_gpu)
        ],  # no MIG values (Ampere has no GPM), no processes
    }
    ingest_tick(fleet, empty)
    values = stored(mem_store, fleet.host.pk, now)
    assert set(values) == {fleet.mig.pk, fleet.mps_a.pk, fleet.mps_b.pk, fleet.whole.pk}
    assert values[fleet.whole.pk] == (None, None)
    assert all(v == (None, None) for v in values.values())


def test_a_mig_instance_without_gpm_keeps_its_memory_and_no_utilisation(fleet, mem_store):
    now = time.time()
    ingest_tick(fleet, busy_tick(fleet, now, util=None))
    assert stored(mem_store, fleet.host.pk, now)[fleet.mig.pk] == (None, 9000.0)


def test_cached_maps_cost_no_query_for_replicas(fleet, mem_store):
    ingest_tick(fleet, busy_tick(fleet))
    with CaptureQueriesContext(connection) as queries:
        ingest_tick(fleet, busy_tick(fleet))
    assert not any("allocation" in q["sql"] for q in queries.captured_queries)


def test_the_replica_map_is_cached_until_the_host_is_forgotten(fleet, mem_store):
    from fleet.allocations.models import Allocation

    now = time.time()
    ingest_tick(fleet, busy_tick(fleet, now))
    Allocation.objects.filter(pk=fleet.mps_b.pk).delete()  # released, the agent not told yet
    ingest_tick(fleet, busy_tick(fleet, now + 1))
    assert fleet.mps_b.pk in stored(mem_store, fleet.host.pk, now + 1)  # cached
    gpu_maps.forget_host(fleet.host.pk)  # what an ack's observed GPUs do once committed
    mem_store.clear()
    ingest_tick(fleet, busy_tick(fleet, now + 2))
    measured = stored(mem_store, fleet.host.pk, now + 2)
    assert fleet.mps_b.pk not in measured and fleet.mps_a.pk in measured


def stores() -> list[Any]:
    found: list[Any] = [pytest.param(lambda: MemoryStore(3600), id="memory")]
    url = os.environ.get("FLEET_REDIS_URL", "")
    found.append(
        pytest.param(
            lambda: RedisStore(url, f"fleet:tel:test-replicas-{os.getpid()}:", 3600),
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


def test_stores_round_trip_replica_points_beside_gpu_points(store):
    ts = 1_800_000_000.0 + 12.345
    store.record_many(
        [
            HostRecord(
                7, ts, ts, [], [ReplicaTick(2**40, 55.5, 1024.0), ReplicaTick(3, None, None)]
            ),
            HostRecord(8, ts, ts, []),
        ]
    )
    minute = int(ts // MINUTE)
    buckets = store.replica_buckets([7, 8], minute)
    assert set(buckets) == {7}  # a host without replicas writes no bucket
    points = unpack_replicas(minute, buckets[7])
    assert [(a, p["utilization_percent"], p["memory_used_mib"]) for a, p in points] == [
        (2**40, 55.5, 1024.0),
        (3, None, None),
    ]
    assert abs(points[0][1]["ts"] - ts) < 0.001
    assert not store.raw_buckets([7], minute).get(7)  # GPU points are apart


def test_rollup_writes_minute_means_once_and_retention_bounds_the_table(fleet, mem_store):
    now = 1_800_000_000.0 - 1_800_000_000.0 % MINUTE + 20
    for s in range(180):
        util = None if s % 2 else 40.0
        mem_store.record_many(
            [
                HostRecord(
                    fleet.host.pk,
                    now - 200 + s,
                    now,
                    [],
                    [ReplicaTick(fleet.mig.pk, util, 100.0), ReplicaTick(999_999, 1.0, 1.0)],
                )
            ]
        )
    assert replica_rollup(now=now) == 3  # three closed minutes; the unknown replica dropped
    assert replica_rollup(now=now) == 0  # idempotent
    rows = list(ReplicaSample.objects.order_by("ts"))
    assert [(r.allocation_id, r.utilization_percent, r.memory_used_mib) for r in rows] == [
        (fleet.mig.pk, 40.0, 100.0)
    ] * 3
    ReplicaSample.objects.create(
        allocation=fleet.mig, ts=datetime.fromtimestamp(now, tz=UTC) - timedelta(days=8)
    )
    assert replica_retention(now=datetime.fromtimestamp(now, tz=UTC)) == 1
    assert ReplicaSample.objects.count() == 3


def test_the_rollup_task_covers_gpus_and_replicas(fleet, mem_store):
    from fleet.tasks import telemetry_retention, telemetry_rollup

    assert telemetry_rollup() == 0 and telemetry_retention() == 0


def test_series_buckets_keep_every_window_within_720_points():
    assert [bucket_seconds(s) for s in (3600, 86_400, 7 * 86_400)] == [5, 120, 840]


def test_the_hour_comes_from_the_hot_store_and_longer_windows_from_minute_means(fleet, mem_store):
    now = 1_800_000_000.0 - 1_800_000_000.0 % 3600 + 30.0
    for s in range(120):
        util = None if s < 60 else 50.0
        mem_store.record_many(
            [
                HostRecord(
                    fleet.host.pk, now - 120 + s, now, [], [ReplicaTick(fleet.mig.pk, util, 10.0)]
                )
            ]
        )
    hour = replica_series(fleet.mig, window="1h", now=now)
    assert hour["source"] == "mig_instance" and hour["bucket_s"] == 5
    assert len(hour["points"]) == 24  # two minutes of 1 s points in 5 s buckets
    assert hour["points"][0]["utilization_percent"] is None  # no value: kept None
    assert hour["points"][-1] == {
        "ts": now - 5,
        "utilization_percent": 50.0,
        "memory_used_mib": 10.0,
    }
    ReplicaSample.objects.create(
        allocation=fleet.mig,
        ts=datetime.fromtimestamp(now - 30 - 2 * 86_400, tz=UTC),
        utilization_percent=None,
        memory_used_mib=20.0,
    )
    week = replica_series(fleet.mig, window="7d", now=now)
    assert week["bucket_s"] == 840 and len(week["points"]) <= 720
    assert week["points"][0]["memory_used_mib"] == 20.0
    assert week["points"][-1]["utilization_percent"] == 50.0  # recent minutes from the store
    day = replica_series(fleet.mps_a, window="24h", now=now)
    assert day["source"] == "processes" and day["points"] == []
    assert replica_series(fleet.whole, window="24h", now=now)["source"] == "gpu"
