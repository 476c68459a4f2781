"""The styled error pages in a real browser: a viewer who opens an admin-only page (there is no
page for operators only: an operator's extra powers are actions on pages everyone sees) gets the
styled 403 saying which role it needs, with a way back; an unknown deployment, and a deployment
once deleted, get the styled 404 with links back to the list.

Run: ``.venv/bin/pytest tests/browser/test_error_pages.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.browser


def _styled(page: Any, card: str) -> None:
    """The page is Fleet's own: its stylesheet applied to the card, not a bare browser page."""
    assert page.locator(f"#{card}").is_visible()
    radius = page.locator(f"#{card}").evaluate("(c) => getComputedStyle(c).borderTopLeftRadius")
    assert radius not in ("", "0px"), radius
    assert page.title().endswith("· Fleet")


def test_a_viewer_on_an_admin_only_page_gets_the_styled_403_with_a_way_back(
    new_session: Any,
) -> None:
    session = new_session("viewer")
    page = session.page
    response = page.goto(f"{session.stack.url}/alerts/")
    assert response is not None and response.status == 403
    _styled(page, "no-access")
    alert = page.get_by_role("alert")
    assert "Your role, viewer, does not open this page: it needs admin" in alert.inner_text()
    page.get_by_role("link", name="Back to the fleet").click()
    page.wait_for_url(f"{session.stack.url}/")
    session.wait_live()
    assert session.errors == []


def test_an_unknown_deployment_gets_the_styled_404_with_links_back(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    response = page.goto(f"{session.stack.url}/deployments/987654321/")
    assert response is not None and response.status == 404
    _styled(page, "not-found")
    assert page.get_by_role("heading", name="Not found").is_visible()
    assert "/deployments/987654321/" in page.locator("#not-found code").inner_text()
    page.get_by_role("link", name="Deployments").click()
    page.wait_for_url(f"{session.stack.url}/deployments/")
    session.wait_live()


def test_after_a_delete_the_list_is_shown_and_the_old_page_is_the_styled_404(
    new_session: Any,
) -> None:
    session = new_session("operator")
    page = session.page
    status, created = session.api(
        "POST",
        "/api/v1/deployments/",
        {"name": "err-page-gone", "kind": "mig", "profile": "1g.10gb"},
    )
    assert status == 201, created
    page.goto(f"{session.stack.url}/deployments/{created['id']}/")
    session.wait_live()
    page.locator("#dep-delete").click()
    page.get_by_role("alertdialog").get_by_role("button", name="Delete", exact=True).click()
    page.wait_for_url(f"{session.stack.url}/deployments/?deleted=err-page-gone", timeout=15_000)
    assert "err-page-gone is being deleted" in page.locator("#deleted-note").inner_text()

    def gone() -> bool:
        return session.api("GET", f"/api/v1/deployments/{created['id']}/")[0] == 404

    for _ in range(60):
        if gone():
            break
        page.wait_for_timeout(500)
    response = page.goto(f"{session.stack.url}/deployments/{created['id']}/")
    assert response is not None and response.status == 404
    _styled(page, "not-found")
    page.get_by_role("link", name="The fleet").click()
    page.wait_for_url(f"{session.stack.url}/")
