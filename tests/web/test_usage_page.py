"""The usage page: viewers and up; the chart's bands per team, the table of the API's numbers,
the controls and the CSV link."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.allocations.accounting.usage import Window, usage_window
from fleet.allocations.models import UsageInterval
from fleet.web.views_usage import HEIGHT, stacked_bands

pytestmark = pytest.mark.django_db


def held(team: str, kind: str, hours_ago: float, **fields) -> None:  # type: ignore[no-untyped-def]
    n = UsageInterval.objects.count() + 1
    UsageInterval.objects.create(
        allocation_id=n,
        deployment_id=n,
        deployment_name=f"{team}-{n}",
        team_id=len(team),
        team_name=team,
        replica=0,
        kind=kind,
        gpu_id=1,
        gpu_memory_mib=81920,
        product_key="h100-sxm5-80gb",
        product_name="NVIDIA H100 80GB HBM3",
        started_at=timezone.now() - timedelta(hours=hours_ago),
        **fields,
    )


def test_the_page_shows_the_chart_table_and_csv_link(viewer_web):
    held("search", "gpu", 5, gpu_count=1)
    held("ads", "mig", 30, compute_slices=7, gpu_compute_slices=7)
    response = viewer_web.get("/usage/?window=24h&group_by=team")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="usage-chart"' in html and html.count("<path ") == 2
    assert '<th scope="row">ads</th><td class="mono">24.00</td>' in html
    assert '<th scope="row">search</th><td class="mono">5.00</td>' in html
    assert "/api/v1/usage?from=" in html and "format=csv" in html
    assert 'aria-current="page">Usage</a>' in html


def test_group_by_deployment_and_an_empty_window(viewer_web):
    response = viewer_web.get("/usage/?group_by=deployment&window=7d")
    html = response.content.decode()
    assert '<th scope="col">Deployment</th>' in html and "No usage in this window." in html


def test_the_page_needs_a_role(nobody_web):
    assert nobody_web.get("/usage/").status_code == 403


def test_bands_stack():
    now = timezone.now()
    window: Window = usage_window(now - timedelta(hours=2), now, "team", now=now)
    bands, y_max = stacked_bands(
        [window.start, window.start + timedelta(hours=1)],
        {"a": [1.0, 1.0], "b": [1.0, 0.0]},
        window,
    )
    assert y_max == pytest.approx(2.2)
    assert [b.total_hours for b in bands] == [2.0, 1.0]
    assert bands[0].path.startswith(f"M0,{HEIGHT}")
