"""``GET /api/v1/usage``: any role reads it, bad windows are the 400 envelope, CSV has one row
per group."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from django.utils import timezone

from fleet.allocations.models import UsageInterval
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

NOW = timezone.now()


@pytest.fixture(autouse=True)
def fixed_now():  # type: ignore[no-untyped-def]
    """The report's now is the history's now (open intervals count until it)."""
    with mock.patch("fleet.allocations.accounting.usage.timezone.now", return_value=NOW):
        yield


def row(allocation_id: int, team: str, kind: str, hours_ago: float, **fields) -> UsageInterval:  # type: ignore[no-untyped-def]
    base = {
        "allocation_id": allocation_id,
        "deployment_id": allocation_id,
        "deployment_name": f"dep-{allocation_id}",
        "team_id": {"search": 1, "ads": 2}[team],
        "team_name": team,
        "replica": 0,
        "kind": kind,
        "gpu_id": 1,
        "gpu_memory_mib": 81920,
        "product_key": "h100-sxm5-80gb",
        "product_name": "NVIDIA H100 80GB HBM3",
        "started_at": NOW - timedelta(hours=hours_ago),
    }
    return UsageInterval.objects.create(**{**base, **fields})


@pytest.fixture
def history():
    row(1, "search", "gpu", 10, gpu_count=1, ended_at=NOW - timedelta(hours=8))  # 2 GPU-h
    row(2, "search", "mig", 30, compute_slices=3, gpu_compute_slices=7)  # 24 h in the window
    row(3, "ads", "mps", 4, memory_mib=40960, compute_percent=25)  # 4 h of 40 GiB


def fmt(when: datetime) -> str:
    return when.astimezone(UTC).isoformat()


@pytest.mark.parametrize("client", ["viewer_client", "operator_client", "admin_client"])
def test_every_role_reads_usage_per_team(request, client, history):
    response = request.getfixturevalue(client).get("/api/v1/usage")
    assert response.status_code == 200, response.json()
    body = response.json()
    by = {g["name"]: g for g in body["groups"]}
    assert by["search"]["gpu_hours"] == pytest.approx(2)
    assert by["search"]["mig_slice_hours"] == pytest.approx(72, abs=0.01)
    assert by["search"]["gpu_equivalent_hours"] == pytest.approx(2 + 24 * 3 / 7, abs=0.01)
    assert by["ads"]["mps_gib_hours"] == pytest.approx(160, abs=0.01)
    assert by["ads"]["mps_compute_percent_hours"] == pytest.approx(100, abs=0.01)
    assert by["ads"]["gpu_equivalent_hours"] == pytest.approx(2, abs=0.01)  # 0.5 memory x 4 h
    assert body["group_by"] == "team" and set(body["totals"]) == set(by["ads"]) - {"key", "name"}


def test_a_window_clips_and_groups_by_deployment(viewer_client, history):
    start, end = NOW - timedelta(hours=9), NOW - timedelta(hours=3)
    response = viewer_client.get(
        "/api/v1/usage", {"from": fmt(start), "to": fmt(end), "group_by": "deployment"}
    )
    by = {g["name"]: g for g in response.json()["groups"]}
    assert by["dep-1"]["gpu_hours"] == pytest.approx(1)  # 9 h ago to 8 h ago
    assert by["dep-2"]["mig_slice_hours"] == pytest.approx(18)  # 6 h x 3
    assert by["dep-3"]["mps_gib_hours"] == pytest.approx(40)  # 1 h
    assert by["dep-2"]["key"] == "2"


def test_group_by_product(viewer_client, history):
    groups = viewer_client.get("/api/v1/usage?group_by=product").json()["groups"]
    assert [g["key"] for g in groups] == ["h100-sxm5-80gb"]


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"from": "yesterday"}, "invalid"),
        ({"group_by": "host"}, "invalid"),
        ({"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "usage.bad_window"),
        ({"from": "2024-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "usage.window_too_long"),
    ],
)
def test_bad_input_is_the_400_envelope(viewer_client, query, code):
    body = assert_error(viewer_client.get("/api/v1/usage", query), 400)
    if code != "invalid":
        assert body["code"] == code
    assert body["details"]


@pytest.mark.parametrize("how", ["accept", "format"])
def test_csv_has_one_row_per_group(viewer_client, history, how):
    if how == "accept":
        response = viewer_client.get("/api/v1/usage", HTTP_ACCEPT="text/csv")
    else:
        response = viewer_client.get("/api/v1/usage?format=csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert sorted(r["name"] for r in rows) == ["ads", "search"]
    assert set(rows[0]) >= {"team", "name", "gpu_equivalent_hours", "from", "to"}


def test_csv_errors_are_json(viewer_client):
    assert_error(viewer_client.get("/api/v1/usage?to=nope", HTTP_ACCEPT="text/csv"), 400)


def test_usage_needs_a_login(anon_client):
    assert_error(anon_client.get("/api/v1/usage"), 401)


@pytest.mark.parametrize("path", ["/api/v1/usage", "/api/v1/hosts/", "/api/v1/operations/"])
def test_an_unknown_format_is_a_400_that_names_the_known_ones(viewer_client, path):
    """Not DRF's 404, which reads as "no such resource" (found by schemathesis)."""
    response = viewer_client.get(f"{path}?format=AAA")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid", body
    assert "use" in body["details"]["fields"]["format"][0] and "json" in body["message"]
