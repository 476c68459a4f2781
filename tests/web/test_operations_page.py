"""The operations page: 200 rows a page with older pages behind a cursor, the API's filters
(user, kind, status, time), and a CSV link carrying the same filters."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.core.models import Operation, OperationKind
from fleet.core.operations import operation_record

pytestmark = pytest.mark.django_db


def shown(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'data-op="(\d+)"', html)]


def test_the_feed_pages_past_200_rows_without_gaps_or_repeats(viewer_web):
    for i in range(450):
        operation_record(kind=OperationKind.CORDON, summary=f"op {i}", status="succeeded")
    ids = list(Operation.objects.order_by("-created_at", "-id").values_list("pk", flat=True))
    seen: list[int] = []
    url = "/operations/"
    pages = 0
    while url:
        html = viewer_web.get(url).content.decode()
        rows = shown(html)
        assert len(rows) <= 200
        seen += rows
        pages += 1
        older = re.search(r'href="(\?[^"]*)" id="ops-older"', html)
        url = (
            ("/operations/" + older.group(1).replace("&amp;", "&"))
            if older and older.group(1)
            else ""
        )
    assert pages == 3
    assert seen == ids and len(ids) > 400


def test_filters_by_user_and_time_and_links_the_same_csv(viewer_web, operator):
    mine = operation_record(
        kind=OperationKind.CORDON, summary="mine", status="succeeded", requested_by=operator
    )
    other = operation_record(kind=OperationKind.CORDON, summary="other", status="succeeded")
    old = operation_record(kind=OperationKind.PLACE, summary="old", status="failed")
    Operation.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=3))
    html = viewer_web.get(f"/operations/?user={operator.username}").content.decode()
    assert shown(html) == [mine.pk]
    assert f'href="/api/v1/operations/?user={operator.username}&amp;format=csv"' in html
    day = (timezone.now() - timedelta(days=1)).date().isoformat()
    assert shown(viewer_web.get(f"/operations/?until={day}").content.decode()) == [old.pk]
    assert old.pk not in shown(viewer_web.get(f"/operations/?since={day}").content.decode())
    assert set(shown(viewer_web.get("/operations/?kind=cordon").content.decode())) == {
        mine.pk,
        other.pk,
    }


def test_a_bad_filter_says_so_and_shows_nothing(viewer_web):
    operation_record(kind=OperationKind.CORDON, summary="x", status="succeeded")
    html = viewer_web.get("/operations/?since=not-a-date").content.decode()
    assert 'id="ops-errors"' in html and shown(html) == []


def test_the_signed_in_user_stays_in_the_header_whatever_the_filters(viewer_web, viewer, operator):
    # Issue 27: "The user name vanishes on the Operations page: the view shadows `user`."
    for query in ("", f"?user={operator.username}", "?status=failed&kind=place"):
        html = viewer_web.get(f"/operations/{query}").content.decode()
        whoami = re.search(r'<span class="whoami">.*?</span>(.*?) <span class="role', html, re.S)
        assert whoami and whoami.group(1).strip() == viewer.username, (query, whoami)
    html = viewer_web.get(f"/operations/?user={operator.username}&status=failed").content.decode()
    assert f'value="{operator.username}"' in html  # the filter keeps its value
    assert '<option value="failed" selected>' in html
