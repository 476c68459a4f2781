"""``GET /api/v1/allocations/{id}/metrics``: a replica's series for 1h, 24h and 7d, ``null``
kept, a bad window refused with the error envelope, any role."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from fleet.allocations.models import ReplicaSample
from fleet.inventory.telemetry import HostRecord, ReplicaTick
from tests.allocations.replica_fleet import ReplicaFleet, replica_fleet
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(mem_store: Any) -> ReplicaFleet:
    f = replica_fleet()
    now = time.time()
    for s in range(30):
        mem_store.record_many(
            [
                HostRecord(
                    f.host.pk,
                    now - 30 + s,
                    now,
                    [],
                    [ReplicaTick(f.mig.pk, None, 9000.0), ReplicaTick(f.whole.pk, 64.0, 30000.0)],
                )
            ]
        )
    return f


def metrics(client: Any, allocation_id: int, query: str = "") -> Any:
    return client.get(f"/api/v1/allocations/{allocation_id}/metrics{query}")


def test_the_hour_is_1s_points_in_buckets_and_none_stays_null(viewer_client, fleet):
    response = metrics(viewer_client, fleet.mig.pk, "?window=1h")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"allocation", "window", "bucket_s", "points", "source"}
    assert (body["allocation"], body["window"], body["bucket_s"], body["source"]) == (
        fleet.mig.pk,
        "1h",
        5,
        "mig_instance",
    )
    assert 6 <= len(body["points"]) <= 8 and len(body["points"]) <= 720
    assert all(p["utilization_percent"] is None for p in body["points"])  # no GPM: null, not 0
    assert {p["memory_used_mib"] for p in body["points"]} == {9000.0}
    assert set(body["points"][0]) == {"ts", "utilization_percent", "memory_used_mib"}


def test_without_a_window_the_hour_is_given(viewer_client, fleet):
    body = metrics(viewer_client, fleet.whole.pk).json()
    assert body["window"] == "1h" and body["source"] == "gpu"
    assert {p["utilization_percent"] for p in body["points"]} == {64.0}


@pytest.mark.parametrize(("window", "bucket_s"), [("24h", 120), ("7d", 840)])
def test_longer_windows_are_minute_means_in_at_most_720_points(
    viewer_client, fleet, window, bucket_s
):
    ReplicaSample.objects.create(
        allocation=fleet.mps_a,
        ts=datetime.fromtimestamp(time.time() // 60 * 60 - 3 * 3600, tz=UTC),
        utilization_percent=None,
        memory_used_mib=1500.0,
    )
    body = metrics(viewer_client, fleet.mps_a.pk, f"?window={window}").json()
    assert body["bucket_s"] == bucket_s and body["source"] == "processes"
    assert body["points"] == [
        {"ts": body["points"][0]["ts"], "utilization_percent": None, "memory_used_mib": 1500.0}
    ]
    assert body["points"][0]["ts"] % bucket_s == 0


@pytest.mark.parametrize("window", ["2h", "", "1H", "7d;drop"])
def test_a_bad_window_is_a_400_envelope(viewer_client, fleet, window):
    body = assert_error(metrics(viewer_client, fleet.mig.pk, f"?window={window}"), 400)
    assert "window" in str(body["details"])


def test_any_role_reads_them_and_anonymous_is_refused(
    anon_client, viewer_client, operator_client, admin_client, fleet
):
    for client in (viewer_client, operator_client, admin_client):
        assert metrics(client, fleet.mig.pk).status_code == 200
    assert_error(metrics(anon_client, fleet.mig.pk), 401)


def test_an_unknown_replica_is_a_404_envelope(viewer_client, fleet):
    assert_error(metrics(viewer_client, 987_654), 404)


def test_the_endpoint_is_in_the_openapi_schema(viewer_client):
    schema = viewer_client.get("/api/schema/")
    assert schema.status_code == 200
    assert "/api/v1/allocations/{id}/metrics:" in schema.content.decode()
