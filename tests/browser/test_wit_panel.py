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


def test_the_panel_applies_a_destructive_moves_plan_after_asking(new_session: Any) -> None:
    # The stage of test_defrag: a 4g.40gb replica fits on no GPU of its host until a 1g.10gb
    # replica moves out of its way. The panel's moves plan asks first (Cancel sends nothing),
    # then, confirmed, moves it make-before-break and places the waiting replica.
    from tests.browser.test_defrag import _placed as _placed_where
    from tests.browser.test_defrag import moves_stage

    session = new_session("operator")
    page = session.page
    with moves_stage(session, "wit") as (stage, small, big):
        page.goto(f"{session.stack.url}/deployments/{big}/")
        panel = page.locator("#wit-panel")
        plan = panel.locator('li[data-kind="moves"]')
        plan.wait_for(timeout=20_000)
        assert f"POST /api/v1/deployments/{big}/defrag" in plan.inner_text()
        apply = plan.get_by_role("button", name="Apply plan")
        sent: list[str] = []
        page.on(
            "request",
            lambda r: sent.append(r.url) if r.method == "POST" and "/defrag" in r.url else None,
        )
        apply.click()
        confirm = page.get_by_role("alertdialog", name="Apply: Move")
        assert "Move 1 replica (make before break)" in confirm.inner_text()
        confirm.get_by_role("button", name="Cancel").click()
        confirm.wait_for(state="detached")
        page.wait_for_timeout(300)
        assert sent == [] and not _placed_where(session, deployment=big)  # cancelled: nothing sent
        apply.click()
        page.get_by_role("alertdialog", name="Apply: Move").get_by_role(
            "button", name="Apply"
        ).click()
        [where] = _wait(
            lambda: _placed_where(session, deployment=big), 90, "the waiting replica placed"
        )
        assert where["gpu"] == stage and len(sent) == 1
        [moved] = _placed_where(session, deployment=small)
        assert moved["gpu"] != stage and moved["workload_state"] == "running"
        page.wait_for_function(
            "() => document.getElementById('wit-box').dataset.witState === 'placed'",
            timeout=15_000,
        )
        assert page.locator(".toast.error").count() == 0
        assert session.errors == []
