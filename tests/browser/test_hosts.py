"""The host pages in a real browser against the running stack (ASGI server + simulated agents).

Run: ``.venv/bin/pytest tests/browser/test_hosts.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser


@pytest.fixture
def host(settled_fleet: Any, admin_token: str) -> Iterator[dict[str, Any]]:
    """A demo host, back in service after the test (the other browser tests want every host
    ready)."""
    status, body = settled_fleet.api("GET", "/api/v1/hosts/?limit=500", admin_token)
    assert status == 200 and body["results"]
    chosen = body["results"][-1]
    assert chosen["status"] == "ready"
    yield chosen
    settled_fleet.api("POST", f"/api/v1/hosts/{chosen['id']}/uncordon", admin_token)


def test_an_operator_cordons_a_host_from_its_page_and_sees_its_status_change_live(
    new_session: Any, host: dict[str, Any], screenshots: Path
) -> None:
    session = new_session("operator")
    page = session.page
    page.goto(f"{session.stack.url}/hosts/")
    session.wait_live()
    page.get_by_role("link", name=host["name"], exact=True).click()
    page.wait_for_url(f"{session.stack.url}/hosts/{host['id']}/")
    session.wait_live()
    assert page.locator("#host-status").get_attribute("data-status") == "ready"
    page.evaluate("() => { window.__sameDocument = true; }")

    # A refused action shows the API's message.
    page.get_by_role("button", name="Uncordon").click()
    error = page.locator("#maint-error")
    error.wait_for(state="visible")
    assert "not cordoned" in error.inner_text()

    page.get_by_role("button", name="Cordon", exact=True).click()
    page.wait_for_selector('#host-status[data-status="cordoned"]')
    assert page.locator("#host-maint").inner_text().startswith("Cordoned")
    page.screenshot(path=str(screenshots / "host-cordoned.png"), full_page=True)

    # Someone else uncordons it (the API): the page follows over the live socket.
    status, _ = session.api("POST", f"/api/v1/hosts/{host['id']}/uncordon")
    assert status == 200
    page.wait_for_selector('#host-status[data-status="ready"]')
    assert page.evaluate("() => window.__sameDocument") is True  # no reload
    assert session.errors == []


def test_a_viewer_sees_the_host_page_without_maintenance_actions(
    new_session: Any, host: dict[str, Any]
) -> None:
    session = new_session("viewer")
    page = session.page
    page.goto(f"{session.stack.url}/hosts/{host['id']}/")
    session.wait_live()
    assert page.get_by_role("button", name="Cordon", exact=True).count() == 0
    first_gpu = page.locator("#host-gpus tbody th a").first
    first_gpu.click()
    page.wait_for_url(f"{session.stack.url}/gpus/**")
    assert session.errors == []
