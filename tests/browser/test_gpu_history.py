"""The GPU page's 24 h and 7 d ranges in a real browser: the charts switch to the history API's
per-minute means and back to the live hour.

Run: ``.venv/bin/pytest tests/browser/test_gpu_history.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.browser


def test_a_viewer_switches_the_gpu_charts_to_24_hours_7_days_and_back(new_session: Any) -> None:
    session = new_session("viewer")
    page = session.page
    gpu_id = int(page.locator("article.gpu").first.get_attribute("data-gpu"))
    page.goto(f"{session.stack.url}/gpus/{gpu_id}/")
    session.wait_live()
    with page.expect_response(lambda r: f"/api/v1/gpus/{gpu_id}/history?window=24h" in r.url):
        page.click('#range label:has(input[value="86400"]) span')
    page.wait_for_function(
        "() => document.getElementById('range-note').textContent.includes('min each')"
    )
    labels = page.locator("[data-range-label]").all_inner_texts()
    assert labels and set(labels) == {"last 24 hours"}
    assert page.locator("[data-axis-start]").first.text_content() == "\u22121 d"
    with page.expect_response(lambda r: "window=7d" in r.url):
        page.click('#range label:has(input[value="604800"]) span')
    page.wait_for_function(
        "() => document.querySelector('[data-range-label]').textContent === 'last 7 days'"
    )
    page.click('#range label:has(input[value="3600"]) span')
    assert page.locator("[data-range-label]").first.inner_text() == "last hour"
    assert "one point per second" in page.locator("#range-note").inner_text()
    assert page.locator("figure[data-chart] path.line").count() == 4
    assert session.errors == []
