""" "What would it take?" in a real browser against ``manage.py demo``: the panel on the fleet
tray's waiting replica and on the deployment page lists the ranked plans, and Apply sends the top
plan's exact requests, which place the replica.

Run: ``.venv/bin/pytest tests/browser/test_wit_panel.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

pytestmark = pytest.mark.browser

WORKLOAD = {"runtime": "process", "command": ["/bin/sleep", "3600"], "stop_grace_s": 2}


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout} s: {what}")


def _placed(session: Any, deployment: int) -> list[dict[str, Any]]:
    _, body = session.api("GET", f"/api/v1/allocations/?deployment={deployment}&limit=100")
    return [a for a in body["results"] if a["state"] != "releasing"]


def _deploy(session: Any, name: str, **extra: Any) -> int:
    status, created = session.api(
        "POST",
        "/api/v1/deployments/",
        {
            "name": name,
            "kind": "mig",
            "profile": "1g.10gb",
            "auto": False,
            "workload": WORKLOAD,
            **extra,
        },
    )
    assert status == 201, created
    return int(created["id"])


def test_the_trays_panel_places_a_waiting_replica_that_fits(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    deployment = _deploy(session, "wit-tray")
    try:
        card = page.locator(f"#dep-{deployment}")
        card.wait_for(timeout=20_000)
        card.get_by_role(
            "button", name="What would it take to place the next replica of wit-tray?"
        ).click()
        dialog = page.locator("#wit-dialog")
        plan = dialog.locator('li[data-kind="place"]')
        plan.wait_for(timeout=15_000)
        assert (
            plan.locator("code")
            .first.inner_text()
            .startswith(f"POST /api/v1/deployments/{deployment}/place ")
        )
        assert dialog.locator("li.wit-plan").last.get_attribute("data-kind") == "wait"
        plan.get_by_role("button", name="Apply plan 1: It fits now: place it.").click()
        _wait(lambda: _placed(session, deployment), 30, "the replica placed")
        dialog.get_by_text("Every replica is placed: nothing to do.").wait_for(timeout=15_000)
        assert page.locator(".toast.error").count() == 0
        assert session.errors == []
    finally:
        session.api("DELETE", f"/api/v1/deployments/{deployment}/")


def test_the_deployment_pages_panel_applies_a_quota_change_and_places_the_replica(
    new_session: Any,
) -> None:
    session = new_session("admin")
    page = session.page
    status, team = session.api("POST", "/api/v1/teams/", {"name": "wit-quota"})
    assert status == 201, team
    status, _ = session.api("PUT", f"/api/v1/teams/{team['id']}/quota", {"mig_compute_slices": 0})
    assert status == 200
    # The demo's process workloads, as the default team may run them.
    _, teams = session.api("GET", "/api/v1/teams/?limit=100")
    default = next(t for t in teams["results"] if t["slug"] == "default")
    _, policy = session.api("GET", f"/api/v1/teams/{default['id']}/policy")
    allowed = {k: policy[k] for k in ("runtimes", "process_user", "uids")}
    status, _ = session.api("PUT", f"/api/v1/teams/{team['id']}/policy", allowed)
    assert status == 200
    deployment = _deploy(session, "wit-quota-serve", team=team["id"])
    try:
        page.goto(f"{session.stack.url}/deployments/{deployment}/")
        panel = page.locator("#wit-panel")
        plan = panel.locator('li[data-kind="quota"]')
        plan.wait_for(timeout=15_000)
        assert "Its team's quota blocks it." in panel.inner_text()
        body = json.dumps({"mig_compute_slices": 1}, separators=(",", ":"))
        assert f"PUT /api/v1/teams/{team['id']}/quota {body}" in plan.inner_text()
        plan.get_by_role(
            "button", name=f"Apply plan 1: {plan.locator('.wit-summary').inner_text()}"
        ).click()
        _wait(lambda: _placed(session, deployment), 30, "the replica placed")
        page.wait_for_function(
            "() => document.getElementById('wit-box').dataset.witState === 'placed'",
            timeout=15_000,
        )
        _, after = session.api("GET", f"/api/v1/teams/{team['id']}/")
        assert after["quota"]["mig_compute_slices"] == 1
        assert page.locator(".toast.error").count() == 0
        assert session.errors == []
    finally:
        session.api("DELETE", f"/api/v1/deployments/{deployment}/")
        _wait(
            lambda: session.api("GET", f"/api/v1/deployments/{deployment}/")[0] == 404,
            30,
            "the deployment gone",
        )
        session.api("DELETE", f"/api/v1/teams/{team['id']}/")


def test_a_viewer_sees_the_plans_without_apply(new_session: Any) -> None:
    session = new_session("viewer")
    page = session.page
    _, listed = session.api("GET", "/api/v1/queue/")
    assert listed["waiting"], "the demo fleet has waiting replicas"
    first = listed["waiting"][0]
    page.goto(f"{session.stack.url}/deployments/{first['deployment']}/")
    panel = page.locator("#wit-box")
    panel.locator("li.wit-plan").first.wait_for(timeout=15_000)
    assert panel.locator("[data-wit-apply]").count() == 0
    assert "may apply it" in panel.inner_text()
    assert session.errors == []
