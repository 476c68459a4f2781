"""Issue 27 item 9: forms instead of JSON. An admin adds an alert webhook from the Alerts page
(webhooks were API-only); a refusal is shown in place and creates nothing."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.browser


def test_an_admin_adds_a_webhook_with_a_form(new_session: Any) -> None:
    session = new_session("admin")
    page = session.page
    page.goto(f"{session.stack.url}/alerts/")
    session.wait_live()
    _, before = session.api("GET", "/api/v1/alerts/webhooks/?limit=100")
    form = page.locator("#webhook-form")
    if not form.is_visible():
        page.get_by_text("New webhook").click()
    form.get_by_label("URL").fill("https://hooks.example.test/fleet/T0/secret-path")
    form.get_by_label("Secret").fill("too-short")
    form.get_by_label("Enabled").uncheck()  # nothing is sent to the made-up host
    form.get_by_role("button", name="Add webhook").click()
    error = page.locator("#webhook-error")
    error.wait_for(state="visible")
    assert "secret" in error.inner_text().lower()
    assert form.get_by_label("Secret").get_attribute("aria-invalid") == "true"
    _, after = session.api("GET", "/api/v1/alerts/webhooks/?limit=100")
    assert after["count"] == before["count"]  # refused: nothing created

    form.get_by_label("Secret").fill("a-long-enough-signing-secret")
    form.locator('input[name="events"]').first.uncheck()
    with page.expect_navigation():
        form.get_by_role("button", name="Add webhook").click()
    row = page.locator("#webhooks tbody tr").last
    assert "https://hooks.example.test/" in row.inner_text()
    assert "secret-path" not in page.content()  # the path and the secret stay write-only
    _, created = session.api("GET", "/api/v1/alerts/webhooks/?limit=100")
    hook = max(created["results"], key=lambda h: h["id"])
    try:
        assert hook["enabled"] is False and hook["format"] == "fleet"
        assert len(hook["events"]) >= 1
        assert session.errors == []
    finally:
        session.api("DELETE", f"/api/v1/alerts/webhooks/{hook['id']}/")
