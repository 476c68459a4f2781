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


def test_an_operator_dry_runs_a_rollout_from_the_new_rollout_form(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    page.goto(f"{session.stack.url}/rollouts/")
    session.wait_live()
    form = page.locator("#rollout-new")
    product = next(o for o in form.locator("#ro-product option").all_inner_texts() if "A30" in o)
    form.get_by_label("GPUs of the product").select_option(label=product)
    slices = form.get_by_label("MIG slices")
    slices.fill("9g.99gb@0")
    sent: list[Any] = []
    page.on(
        "request",
        lambda r: sent.append(r.post_data_json) if r.url.endswith("/api/v1/rollouts/") else None,
    )
    form.get_by_role("button", name="Dry run").click()
    # Refused (400) or planned with a problem a GPU: either way the form says why, in place.
    error = page.locator("#ro-error:not([hidden]), #ro-plan .form-error").first
    error.wait_for(state="visible")
    assert "9g.99gb" in error.inner_text(), error.inner_text()

    slices.fill("4g.24gb@0")
    form.get_by_role("button", name="Dry run").click()
    result = page.locator("#ro-plan p")
    result.wait_for()
    assert result.inner_text().startswith("Dry run: "), result.inner_text()
    assert " GPUs reshaped" in result.inner_text() or " GPU reshaped" in result.inner_text()
    assert sent[-1] == {
        "selector": {"product": product},
        "layout": {"mode": "mig", "instances": [{"profile": "4g.24gb", "start": 0}]},
        "max_unavailable": 1,
        "timeout_s": 600,
        "dry_run": True,
    }
    # The JSON view shows the body the form sends (dry_run aside), for the API.
    page.get_by_text("JSON", exact=True).click()
    assert '"4g.24gb"' in form.locator("#ro-json").inner_text()
    # Start asks first; cancelled, no rollout starts.
    form.get_by_role("button", name="Start rollout").click()
    confirm = page.get_by_role("alertdialog", name="Start this rollout?")
    assert "reshaped" in confirm.inner_text()
    confirm.get_by_role("button", name="Cancel").click()
    assert all(body["dry_run"] for body in sent)
    assert session.errors == []
