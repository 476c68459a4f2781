"""The health events agents report, readable through the API (the GPU page shows the same)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.inventory.models import HealthEvent
from tests.factories import GpuFactory
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


def test_events_are_listed_newest_first_and_filtered(viewer_client, anon_client):
    gpu = GpuFactory()
    now = timezone.now()
    HealthEvent.objects.create(host=gpu.host, gpu=gpu, kind="xid", xid=79, ts=now - timedelta(1))
    HealthEvent.objects.create(host=gpu.host, kind="crashloop", detail="llm[0]", ts=now)
    body = viewer_client.get("/api/v1/events/").json()
    assert [e["kind"] for e in body["results"]] == ["crashloop", "xid"]
    only = viewer_client.get(f"/api/v1/events/?kind=crashloop&host={gpu.host_id}").json()
    assert only["count"] == 1 and only["results"][0]["detail"] == "llm[0]"
    recent = viewer_client.get("/api/v1/events/", {"since": (now - timedelta(hours=1)).isoformat()})
    assert recent.json()["count"] == 1
    assert viewer_client.get("/api/v1/events/?kind=nonsense").status_code == 400
    assert anon_client.get("/api/v1/events/").status_code in (401, 403)


@pytest.mark.parametrize(
    "since",
    [
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "yesterday",
    ],
)
def test_a_time_that_does_not_exist_in_utc_is_a_400_not_a_500(viewer_client, since):
    response = viewer_client.get("/api/v1/events/", {"since": since})
    assert_error(response, 400)


@pytest.mark.parametrize(
    "since",
    # Offsets PostgreSQL refuses (past ±15:59), which ISO 8601 allows: found by schemathesis.
    ["2026-01-01T00:00:00-22:14", "0223-09-07T13:38:05.5307-22:14"],
)
def test_a_far_offset_is_read_in_utc(viewer_client, since):
    response = viewer_client.get("/api/v1/events/", {"since": since})
    assert response.status_code == 200, response.json()
