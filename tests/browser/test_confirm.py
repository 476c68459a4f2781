"""Issue 27 item 4: one confirm dialog guards every destructive action and states its impact.

Cancel (or Escape) sends nothing; the action's own button sends it. Deleting (and its return to
the list) and scaling down are covered in test_deployment_actions and test_deployments; here the
host drain and the tray's evict, which stop or move running replicas too.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

pytestmark = pytest.mark.browser


def _posts(page: Any, fragment: str) -> list[str]:
    sent: list[str] = []
    page.on(
        "request",
        lambda r: sent.append(r.url) if r.method == "POST" and fragment in r.url else None,
    )
    return sent


def test_a_host_drain_asks_first_and_says_how_many_replicas_move(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    status, hosts = session.api("GET", "/api/v1/hosts/?limit=500")
    assert status == 200
    # A host that runs replicas, so the dialog has an impact to state.
    page.goto(f"{session.stack.url}/hosts/{hosts['results'][0]['id']}/")
    session.wait_live()
    replicas = sum(
        int(n)
        for n in page.locator("#host-gpu-table tr[data-replicas]").evaluate_all(
            "rows => rows.map(r => r.dataset.replicas)"
        )
    )
    sent = _posts(page, "/drain")

    page.get_by_role("button", name="Drain", exact=True).click()
    confirm = page.get_by_role("alertdialog", name="Drain this host?")
    text = confirm.inner_text()
    if replicas:
        assert re.search(rf"\b{replicas} replicas? moves? to other hosts", text), text
    else:
        assert "No replica runs here" in text, text
    # Cancel has the focus: Enter, pressed out of habit, destroys nothing.
    assert page.evaluate("document.activeElement.dataset.confirm") == "cancel"
    page.keyboard.press("Enter")
    confirm.wait_for(state="detached")
    page.get_by_role("button", name="Drain", exact=True).click()
    page.get_by_role("alertdialog").get_by_role("button", name="Cancel").click()
    page.wait_for_timeout(300)  # a request, were one sent, would have left by now
    assert sent == []
    assert session.errors == []


def test_evicting_from_the_tray_asks_first_and_says_what_stops(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    card = page.locator('.dep:has([data-action="evict"])').first
    evict = card.locator('[data-action="evict"]')
    name = card.get_attribute("data-name")
    running = card.locator("[data-running]")
    count = int(running.get_attribute("data-running") or 0) if running.count() else 0
    sent = _posts(page, "/evict")

    evict.click()
    confirm = page.get_by_role("alertdialog", name=f"Evict {name}?")
    expected = (
        f"{count} running replica{' stops' if count == 1 else 's stop'}" if count else "released"
    )
    assert expected in confirm.inner_text()
    page.keyboard.press("Escape")
    confirm.wait_for(state="detached")
    page.wait_for_timeout(300)
    assert sent == []
    assert session.errors == []
