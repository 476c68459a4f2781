"""``GET /api/v1/operations/``: paginated past any size, filtered by user, kind, status and time,
and exported as CSV (``Accept: text/csv`` or ``?format=csv``) with the same filters."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from fleet.core.models import Operation, OperationKind
from fleet.core.operations import operation_record
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


def record(n: int, *, kind=OperationKind.CORDON, status="succeeded", user=None) -> list[int]:
    return [
        operation_record(kind=kind, summary=f"op {i}", status=status, requested_by=user).pk
        for i in range(n)
    ]


def test_the_feed_pages_past_200_rows(viewer_client):
    ids = record(250)
    seen: list[int] = []
    url = "/api/v1/operations/?limit=100&kind=cordon"
    while url:
        body = viewer_client.get(url).json()
        seen += [row["id"] for row in body["results"]]
        url = body["next"]
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen)) == 250


def test_filters_by_user_kind_status_and_time(viewer_client, operator):
    mine = record(2, user=operator)
    record(1, kind=OperationKind.PLACE, status="failed")
    old = record(1, kind=OperationKind.PLACE, status="failed")[0]
    Operation.objects.filter(pk=old).update(created_at=timezone.now() - timedelta(days=3))

    def ids(query: str) -> set[int]:
        response = viewer_client.get(f"/api/v1/operations/?{query}")
        assert response.status_code == 200, response.content
        return {row["id"] for row in response.json()["results"]}

    assert ids(f"user={operator.username}") == set(mine)
    assert ids("kind=place&status=failed") - {old} and old in ids("kind=place")
    day_ago = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert old not in ids(f"kind=place&since={day_ago}")
    assert ids(f"kind=place&until={day_ago}") == {old}
    assert_error(viewer_client.get("/api/v1/operations/?since=yesterday"), 400)


@pytest.mark.parametrize("how", ["accept", "format"])
def test_csv_export_has_every_matching_row_with_a_header(viewer_client, operator, how):
    record(3, user=operator)
    operation_record(kind=OperationKind.PLACE, summary="=HYPERLINK(evil)", status="failed")
    if how == "accept":
        response = viewer_client.get("/api/v1/operations/?kind=cordon", HTTP_ACCEPT="text/csv")
    else:
        response = viewer_client.get("/api/v1/operations/?kind=cordon&format=csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == 3
    assert {r["requested_by"] for r in rows} == {operator.username}
    assert {r["kind"] for r in rows} == {"cordon"}
    everything = viewer_client.get("/api/v1/operations/?format=csv")
    text = b"".join(everything.streaming_content).decode()
    assert '"\'=HYPERLINK(evil)"' in text  # never a live formula in a spreadsheet


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_cells_are_quoted_and_formulas_made_text_but_numbers_stay_numbers(viewer_client, start):
    summary = f"{start}cmd|' /C calc'!A0"
    pk = operation_record(
        kind=OperationKind.PLACE, summary="a;b", reason=summary, status="failed"
    ).pk
    text = b"".join(viewer_client.get("/api/v1/operations/?format=csv").streaming_content).decode()
    # A ';'-splitting spreadsheet keeps a quoted cell whole.
    assert '"a;b"' in text
    # Quoted: text; bare: numbers (the reader turns these into floats, and fails on bare text).
    header, *rows = csv.reader(io.StringIO(text, newline=""), quoting=csv.QUOTE_NONNUMERIC)
    (cells,) = (dict(zip(header, row, strict=True)) for row in rows if row[0] == pk)
    assert isinstance(cells["id"], float)
    assert cells["summary"] == "a;b"
    assert cells["reason"] == "'" + summary
    assert cells["kind"] == "place" and cells["host"] == ""


def test_a_bad_filter_with_csv_asked_is_still_the_json_error_envelope(viewer_client):
    response = viewer_client.get("/api/v1/operations/?since=nope", HTTP_ACCEPT="text/csv")
    assert_error(response, 400)


def test_csv_needs_a_role(anon_client):
    assert_error(anon_client.get("/api/v1/operations/?format=csv"), 401)


def test_deleting_a_user_keeps_who_made_their_changes(viewer_client, make_user):
    """The audit keeps its actor: the username at the time, in the API, the filter, the CSV
    and the pages, after the user is deleted (issue 22, defect 5)."""
    gone = make_user("operator", "gone-user")
    [pk] = record(1, user=gone)
    gone.delete()
    assert Operation.objects.get(pk=pk).requested_by is None
    row = viewer_client.get("/api/v1/operations/?requested_by=gone-user").json()["results"]
    assert [(r["id"], r["requested_by"]) for r in row] == [(pk, "gone-user")]
    exported = viewer_client.get("/api/v1/operations/?format=csv&requested_by=gone-user")
    assert "gone-user" in b"".join(exported.streaming_content).decode()
    page = Client()
    page.force_login(make_user("viewer", "reader"))
    assert "gone-user" in page.get("/operations/").content.decode()
