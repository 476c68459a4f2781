"""A deployment's operator actions on its page, in a real browser against ``manage.py demo``
(whose agents run workloads as real processes): a rolling update, the defrag proposal, delete.

Run: ``.venv/bin/pytest tests/browser -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

pytestmark = pytest.mark.browser


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def _allocations(session: Any, deployment_id: int) -> list[dict[str, Any]]:
    status, body = session.api("GET", f"/api/v1/allocations/?deployment={deployment_id}")
    assert status == 200
    return list(body["results"])


def _deploy(session: Any, name: str, command: list[str]) -> int:
    workload = {"runtime": "process", "command": command, "stop_grace_s": 2}
    status, created = session.api(
        "POST",
        "/api/v1/deployments/",
        {"name": name, "kind": "mig", "profile": "1g.10gb", "auto": True, "workload": workload},
    )
    assert status == 201, created
    return int(created["id"])


def test_a_rolling_update_from_the_deployment_page(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    deployment_id = _deploy(session, "roll-me", ["/bin/sleep", "3600"])
    try:
        _wait(
            lambda: [
                a for a in _allocations(session, deployment_id) if a["workload_state"] == "running"
            ],
            30,
            "the replica running",
        )
        page.goto(f"{session.stack.url}/deployments/{deployment_id}/")
        session.wait_live()
        # Issue 27 item 9: the New-deployment dialog's workload fields, filled as it runs now.
        form = page.locator("#rollout-form")
        assert form.locator('select[name="runtime"]').input_value() == "process"
        command = form.locator('input[name="command"]')
        assert command.input_value() == "/bin/sleep 3600"
        command.fill("/bin/sleep 3601")
        page.locator('#rollout-form button[type="submit"]').click()

        def updated() -> bool:
            rows = _allocations(session, deployment_id)
            return (
                len(rows) == 1
                and rows[0]["workload"]["command"] == ["/bin/sleep", "3601"]
                and rows[0]["workload_state"] == "running"
            )

        _wait(updated, 40, "the replica on the new version")
        # A bad workload is refused with the API's words, and changes nothing.
        # The JSON view stays, for those who want it.
        page.get_by_text("JSON view").click()
        textarea = page.locator("#rollout-workload")
        assert json.loads(textarea.input_value())["runtime"] == "process"
        textarea.fill('{"runtime": "process"}')
        page.locator('#rollout-form button[type="submit"]').click()
        error = page.locator("#rollout-error")
        error.wait_for(timeout=10_000)
        assert "command" in error.inner_text().lower()
        assert session.errors == []
    finally:
        session.api("DELETE", f"/api/v1/deployments/{deployment_id}/")


def test_the_defrag_proposal_and_delete_from_the_deployment_page(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    deployment_id = _deploy(session, "delete-me", ["/bin/sleep", "3600"])
    page.goto(f"{session.stack.url}/deployments/{deployment_id}/")
    session.wait_live()
    page.locator("#defrag-show").click()
    plan = page.locator("#defrag-plan")
    plan.locator("p, ol").first.wait_for(timeout=10_000)
    assert plan.inner_text().strip()
    page.locator("#dep-delete").click()
    confirm = page.get_by_role("alertdialog", name="Delete delete-me?")
    assert "The audit trail stays" in confirm.inner_text()
    confirm.get_by_role("button", name="Delete", exact=True).click()
    page.wait_for_url(f"{session.stack.url}/deployments/?deleted=delete-me", timeout=15_000)
    session.wait_live()
    assert "delete-me is being deleted" in page.locator("#deleted-note").inner_text()
    _wait(
        lambda: session.api("GET", f"/api/v1/deployments/{deployment_id}/")[0] == 404,
        30,
        "the deployment gone",
    )
    assert session.errors == []


def test_a_viewer_sees_no_actions(new_session: Any) -> None:
    session = new_session("viewer")
    status, body = session.api("GET", "/api/v1/deployments/?limit=1")
    assert status == 200 and body["results"]
    session.page.goto(f"{session.stack.url}/deployments/{body['results'][0]['id']}/")
    session.wait_live()
    assert session.page.locator("#dep-actions").count() == 0


def test_an_operator_hands_a_deployment_to_another_team_from_its_page(new_session: Any) -> None:
    admin = new_session("admin")
    status, team = admin.api("POST", "/api/v1/teams/", {"name": "handoff-research"})
    assert status == 201, team
    # The new team's policy must allow what the deployment runs (a process, as the demo's).
    _, teams = admin.api("GET", "/api/v1/teams/?limit=100")
    default = next(t for t in teams["results"] if t["slug"] == "default")
    status, policy = admin.api("GET", f"/api/v1/teams/{default['id']}/policy")
    assert status == 200, policy
    status, policy = admin.api("PUT", f"/api/v1/teams/{team['id']}/policy", policy)
    assert status == 200, policy
    session = new_session("operator")
    page = session.page
    deployment_id = _deploy(session, "hand-me", ["/bin/sleep", "3600"])
    try:
        page.goto(f"{session.stack.url}/deployments/{deployment_id}/")
        session.wait_live()
        page.locator("#handoff-team").select_option(label="handoff-research")
        page.locator('#handoff-form button[type="submit"]').click()
        # Handed over, the page reloads: its heading, filters and actions follow the team.
        with page.expect_navigation(timeout=15_000):
            page.get_by_role("button", name="Hand to handoff-research").click()
        session.wait_live()
        status, body = session.api("GET", f"/api/v1/deployments/{deployment_id}/")
        assert status == 200 and body["team_slug"] == "handoff-research", body
        assert session.errors == []
    finally:
        session.api("DELETE", f"/api/v1/deployments/{deployment_id}/")
