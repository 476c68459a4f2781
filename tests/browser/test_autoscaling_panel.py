"""Autoscaling on the deployment page, in a real browser against ``manage.py demo`` (issue 24):
an operator turns it on with the form, a refusal names what to change, the panel shows the
policy, the last evaluation's state and the chart of the replicas against the metric and the
target, the deployments list marks the deployment, and Turn off removes it."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser


def test_an_operator_turns_autoscaling_on_and_off_from_the_page(new_session: Any) -> None:
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
            "name": "as-page",
            "kind": "mig",
            "profile": "1g.10gb",
            "workload": workload,
            "endpoint": {"path_prefix": "/as-page"},
        },
    )
    assert status == 201, created
    try:
        page.goto(f"{session.stack.url}/deployments/{created['id']}/")
        session.wait_live()
        assert page.locator("#dep-autoscaling").count() == 0
        page.locator("#autoscaling-details summary").click()
        page.fill("#as-min", "2")
        page.fill("#as-max", "1")
        page.locator("#autoscaling-form button[type=submit]").click()
        error = page.locator("#autoscaling-error")
        expect(error).to_be_visible(timeout=10_000)
        assert "'max' (1) is below 'min' (2)" in error.inner_text()
        page.fill("#as-min", "1")
        page.fill("#as-max", "3")
        page.select_option("#as-metric", "requests_per_replica_per_s")
        page.fill("#as-target", "4")
        page.locator("#autoscaling-form button[type=submit]").click()
        panel = page.locator("#dep-autoscaling")
        expect(panel).to_contain_text("1\u20133 replicas", timeout=15_000)  # an en dash
        assert "Target 4 req/s per replica" in panel.inner_text()
        # The chart: the replica count over time against the metric and the target (dashed).
        chart = panel.locator("#autoscaling-chart")
        expect(chart).to_be_visible()
        label = chart.locator("svg").nth(1).get_attribute("aria-label") or ""
        assert "against the target of 4" in label
        assert chart.locator("line.as-target").count() == 1
        status, body = session.api("GET", f"/api/v1/deployments/{created['id']}/")
        assert body["autoscaling"]["target"] == {"requests_per_replica_per_s": 4.0}
        page.goto(f"{session.stack.url}/deployments/")
        expect(page.locator(f"#deployment-{created['id']} .dep-auto")).to_have_text("auto 1-3")
        # A replica's own Prometheus metric: its name, port, path and aggregate in the form.
        page.goto(f"{session.stack.url}/deployments/{created['id']}/")
        page.locator("#autoscaling-details summary").click()
        assert page.locator("#as-replica-metric").is_hidden()
        page.select_option("#as-metric", "replica_metric")
        expect(page.locator("#as-replica-metric")).to_be_visible()
        page.fill("#as-rm-name", "vllm:num_requests_waiting")
        page.select_option("#as-rm-port", "http")
        page.fill("#as-target", "5")
        with page.expect_navigation():  # the page reloads once the change is made
            page.locator("#autoscaling-form button[type=submit]").click()
        expect(panel).to_contain_text("vllm:num_requests_waiting", timeout=15_000)
        status, body = session.api("GET", f"/api/v1/deployments/{created['id']}/")
        assert body["autoscaling"]["target"] == {
            "replica_metric": {
                "name": "vllm:num_requests_waiting",
                "value": 5.0,
                "port": "http",
                "path": "/metrics",
                "aggregate": "average",
            }
        }
        # Changing another field keeps the metric (the form shows it as it is set).
        page.locator("#autoscaling-details summary").click()
        expect(page.locator("#as-rm-name")).to_have_value("vllm:num_requests_waiting")
        page.fill("#as-out", "45")
        with page.expect_navigation():
            page.locator("#autoscaling-form button[type=submit]").click()
        expect(panel).to_contain_text("vllm:num_requests_waiting", timeout=15_000)
        status, body = session.api("GET", f"/api/v1/deployments/{created['id']}/")
        assert body["autoscaling"]["scale_out_cooldown_s"] == 45
        assert body["autoscaling"]["target"]["replica_metric"]["name"] == (
            "vllm:num_requests_waiting"
        )
        page.locator("#autoscaling-details summary").click()
        page.locator("#autoscaling-off").click()
        expect(page.locator("#dep-autoscaling")).to_have_count(0, timeout=15_000)
        status, body = session.api("GET", f"/api/v1/deployments/{created['id']}/")
        assert body["autoscaling"] is None
        assert session.errors == []
    finally:
        session.api("DELETE", f"/api/v1/deployments/{created['id']}/")
