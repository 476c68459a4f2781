"""An endpoint's traffic history (issue 23): a point per 10 s and gateway, the last reading of
the bucket winning, gateways summed when read, kept an hour; served by
``GET /deployments/{id}/traffic?window=`` and drawn on the deployment page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet.endpoints.history import deployment_history
from fleet.endpoints.models import TrafficPoint
from fleet.endpoints.traffic import traffic_record
from tests.allocations.test_workloads import mig_gpu as mig_gpu  # the fixture
from tests.endpoints.test_traffic import _endpoint, sample
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_each_bucket_keeps_its_last_reading_and_gateways_add_up(mig_gpu):
    deployment_id, slot, copy = _endpoint(mig_gpu)
    traffic_record("gw-a", [sample(slot, copy, 1.0), sample(slot, 0, 1.0)], now=at(1))
    traffic_record("gw-a", [sample(slot, copy, 4.0), sample(slot, 0, 4.5)], now=at(9))
    traffic_record(
        "gw-b", [sample(slot, copy, 2.0, response_ms=50.0), sample(slot, 0, 2.0)], now=at(9)
    )
    traffic_record("gw-a", [sample(slot, copy, None), sample(slot, 0, None)], now=at(11))
    points = deployment_history(deployment_id, window_s=60, now=at(12))
    assert [p.ts for p in points] == [at(0), at(10)]
    first, second = points
    assert first.requests_per_s == 6.5  # 4.5 (gw-a's last reading of the bucket) + 2.0
    assert first.response_ms == 29.2  # (20 x 4.5 + 50 x 2) / 6.5, weighted by each gateway's rate
    assert first.in_flight == 2 and first.ready_replicas == 1
    assert second.requests_per_s is None  # measuring: not a made-up 0
    assert TrafficPoint.objects.count() == 3


def test_points_older_than_an_hour_go_and_the_window_bounds_the_read(mig_gpu):
    deployment_id, slot, copy = _endpoint(mig_gpu)
    traffic_record("gw", [sample(slot, copy, 1.0)], now=at(0))
    traffic_record("gw", [sample(slot, copy, 2.0)], now=at(600))
    assert len(deployment_history(deployment_id, window_s=300, now=at(601))) == 1
    assert len(deployment_history(deployment_id, window_s=900, now=at(601))) == 2
    traffic_record("gw", [sample(slot, copy, 3.0)], now=at(3605))
    kept = sorted(TrafficPoint.objects.values_list("ts", flat=True))
    assert kept == [at(600), at(3600)]


def test_the_api_serves_a_window_of_history_and_refuses_another(mig_gpu, viewer_client):
    deployment_id, slot, copy = _endpoint(mig_gpu)
    traffic_record("gw", [sample(slot, copy, 3.0), sample(slot, 0, 3.0)])
    url = f"/api/v1/deployments/{deployment_id}/traffic"
    assert "history" not in viewer_client.get(url).json()
    body = viewer_client.get(url + "?window=15m").json()
    (point,) = body["history"]
    assert point["requests_per_s"] == 3.0 and point["ready_replicas"] == 1
    assert_error(viewer_client.get(url + "?window=2d"), 400, "invalid")


def test_the_deployment_page_draws_the_endpoint_s_rate_and_response_time(mig_gpu, client, viewer):
    deployment_id, slot, copy = _endpoint(mig_gpu)
    client.force_login(viewer)
    page = client.get(f"/deployments/{deployment_id}/").content.decode()
    assert 'id="endpoint-charts"' in page and "No gateway measured this endpoint" in page
    traffic_record("gw", [sample(slot, copy, 3.0), sample(slot, 0, 3.0)])
    page = client.get(f"/deployments/{deployment_id}/").content.decode()
    charts = page[page.index('id="endpoint-charts"') :]
    assert "Requests of" in charts and "latest 3 req/s" in charts
    assert "No gateway measured this endpoint" not in charts


def test_metrics_export_each_endpoint_s_traffic_by_deployment_name_only(mig_gpu, viewer_client):
    _, slot, copy = _endpoint(mig_gpu)
    text = viewer_client.get("/metrics").content.decode()
    assert "fleet_endpoint_requests_per_second{" not in text  # nobody measured it: no 0
    traffic_record("gw", [sample(slot, copy, 3.0), sample(slot, 0, 3.5, response_ms=None)])
    text = viewer_client.get("/metrics").content.decode()
    (line,) = [x for x in text.splitlines() if x.startswith("fleet_endpoint_requests_per_second{")]
    assert line.endswith(" 3.5") and line.count("=") == 1  # one label: the deployment
    assert "fleet_endpoint_response_milliseconds{" in text
