"""A deployment's endpoint on its page, in a real browser against ``manage.py demo``: the URL a
caller uses with a Copy button, which replicas the balancer holds (none here: the demo's
agents report no address, so no gateway could reach them, and the page says so), and the live
traffic a gateway measures, re-read while the page is open."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser


def test_the_deployment_page_shows_its_endpoint_url_and_copies_it(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    workload = {
        "runtime": "process",
        "command": ["/bin/sleep", "3600"],
        "ports": [{"name": "http", "port": 8000}],
        "stop_grace_s": 1,
    }
    status, created = session.api(
        "POST",
        "/api/v1/deployments/",
        {
            "name": "ep-page",
            "kind": "mig",
            "profile": "1g.10gb",
            "workload": workload,
            "endpoint": {"path_prefix": "/ep-page"},
        },
    )
    assert status == 201, created
    assert created["endpoint"]["url"] == "http://gateway.test:8080/ep-page"
    try:
        page.goto(f"{session.stack.url}/deployments/{created['id']}/")
        session.wait_live()
        assert page.locator("#endpoint-url").inner_text() == "http://gateway.test:8080/ep-page"
        assert "No replica is in the balancer" in page.locator("#endpoint-replicas").inner_text()
        traffic = page.locator("#endpoint-traffic")
        assert "Traffic not available" in traffic.inner_text()
        # What a gateway records every second (fleet_gateway's meter), written as it would.
        session.stack.manage(
            "shell",
            "-c",
            "from fleet.endpoints.metering import Sample; "
            "from fleet.endpoints.models import Endpoint; "
            "from fleet.endpoints.traffic import traffic_record; "
            f"slot = Endpoint.objects.get(deployment_id={created['id']}).slot; "
            "traffic_record('gw-browser', [Sample(slot, 0, 'ready', 12.5, 0.0, 3, 2, None)])",
        )
        expect(traffic).to_contain_text("12.5 req/s", timeout=15_000)
        text = traffic.inner_text()
        assert "3 in flight" in text and "2 queued" in text, text
        assert "response time not available" in text, text  # no copy measured: not a number
        page.get_by_role("button", name="Copy the endpoint URL").click()
        page.wait_for_selector(".toast", timeout=5000)
        assert "URL" in page.locator(".toast").last.inner_text()
        # Removed through the API: the panel goes with the next live refresh.
        status, _ = session.api(
            "PATCH", f"/api/v1/deployments/{created['id']}/", {"endpoint": None}
        )
        assert status == 200
        page.wait_for_selector("#dep-endpoint", state="detached", timeout=15_000)
        assert session.errors == []
    finally:
        session.api("DELETE", f"/api/v1/deployments/{created['id']}/")
