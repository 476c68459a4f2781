"""The dashboard on a phone (420 px wide) in a real browser: no element reaches outside the
viewport on any page in either colour scheme, tables read as cards, the deployments tray is a
drawer, and the touch paths (Place… from the tray, Move… on a deployment's replica) are reachable.

Run: ``.venv/bin/pytest tests/browser/test_mobile.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Session, Stack
from tests.browser.test_accessibility import PAGES, _open_fleet, _open_tray

pytestmark = pytest.mark.browser

PHONE = {"width": 420, "height": 860}

# Every visible element whose box reaches past the viewport's left or right edge (content
# clipped by an ancestor counts: a clipped cell is as unreadable as one off screen). A mobile
# browser widens its layout viewport to fit wide content, so the edge is the screen's 420 px.
OVERFLOWING = """(width) => [...document.body.querySelectorAll('*')].filter(e => {
    const r = e.getBoundingClientRect();
    if (r.width <= 1 || r.height <= 1) return false;  // visually hidden text
    return r.left < -0.5 || r.right > width + 0.5;
  }).map(e => `${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''}` +
              `${e.className && typeof e.className === 'string' ? '.' + e.className.trim()
                 .split(/\\s+/).join('.') : ''} [${Math.round(e.getBoundingClientRect().left)},` +
              `${Math.round(e.getBoundingClientRect().right)}]`)"""


@pytest.fixture
def phone(chromium: Any, settled_fleet: Stack) -> Iterator[Callable[[str], Session]]:
    """A signed-in tab 420 px wide that presents itself as a touch screen."""
    contexts = []

    def make(username: str) -> Session:
        context = chromium.new_context(viewport=PHONE, has_touch=True, is_mobile=True)
        contexts.append(context)
        return Session(context.new_page(), settled_fleet).login(username)

    yield make
    for context in contexts:
        context.close()


def _open_alerts(session: Session) -> None:
    session.page.goto(session.stack.url + "/alerts/")
    session.page.wait_for_selector("#deliveries", state="attached")


def _open_tray_drawer(session: Session) -> None:
    _open_fleet(session)
    _open_tray(session)


def test_no_element_overflows_a_420_px_viewport_on_any_page_in_either_scheme(
    phone: Callable[[str], Session], screenshots: Path
) -> None:
    admin, viewer = phone("admin"), phone("viewer")
    pages = {**PAGES, "fleet-tray-drawer": _open_tray_drawer, "alerts": _open_alerts}
    login = pages.pop("login")  # it signs out: last
    no_access = pages.pop("no-access")  # an admin opens every page: a viewer's styled 403
    found: dict[str, list[str]] = {}
    for name, open_page, session in [
        *((n, o, admin) for n, o in pages.items()),
        ("no-access", no_access, viewer),
        ("login", login, admin),
    ]:
        page = session.page
        open_page(session)
        for scheme in ("dark", "light"):
            page.emulate_media(color_scheme=scheme)
            wide = page.evaluate("document.documentElement.scrollWidth")
            out = page.evaluate(OVERFLOWING, PHONE["width"])
            if out or wide > PHONE["width"]:
                found[f"{name} ({scheme}, scroll width {wide})"] = out[:6]
        page.screenshot(path=str(screenshots / f"mobile-{name}.png"))
    assert found == {}, "\n".join(f"{k}: {v}" for k, v in found.items())
    assert admin.errors == [] and viewer.errors == []


def test_tables_read_as_labelled_cards_on_a_phone(phone: Callable[[str], Session]) -> None:
    session = phone("operator")
    page = session.page
    page.goto(session.stack.url + "/hosts/")
    session.wait_live()
    row = page.locator("#hosts tbody tr").first
    cell = row.locator("td").first
    label = cell.evaluate("c => getComputedStyle(c, '::before').content")
    header = page.locator("#hosts thead th").nth(1).inner_text()
    assert label.strip('"').lower() == header.strip().lower()
    assert row.bounding_box()["width"] <= PHONE["width"]
    assert page.locator("#hosts thead").bounding_box() is None or (
        page.locator("#hosts thead").bounding_box()["height"] <= 1
    )
    assert session.errors == []


def test_the_tray_is_a_drawer_and_place_opens_a_dialog_that_fits_on_a_phone(
    phone: Callable[[str], Session], screenshots: Path
) -> None:
    session = phone("operator")
    page = session.page
    tray = page.locator("#tray")
    toggle = page.get_by_role("button", name="Deployments")
    assert not tray.is_visible() or not tray.bounding_box()["y"] < PHONE["height"]
    assert toggle.get_attribute("aria-expanded") == "false"
    toggle.click()
    assert toggle.get_attribute("aria-expanded") == "true"
    assert page.evaluate("document.getElementById('tray').contains(document.activeElement)")
    box = tray.bounding_box()
    assert box is not None and box["y"] < PHONE["height"] and box["x"] >= 0
    assert box["x"] + box["width"] <= PHONE["width"]
    place = page.locator('#tray .dep [data-action="place"]').first
    place.tap()
    dialog = page.locator("#place-dialog[open]")
    dialog.locator("#place-targets .target").first.wait_for(timeout=15_000)
    page.screenshot(path=str(screenshots / "mobile-place-dialog.png"))
    box = dialog.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    assert page.evaluate(OVERFLOWING, PHONE["width"]) == []
    page.keyboard.press("Escape")  # the dialog closes; the drawer stays
    page.locator("#place-dialog[open]").wait_for(state="detached")
    assert toggle.get_attribute("aria-expanded") == "true"
    page.keyboard.press("Escape")
    assert toggle.get_attribute("aria-expanded") == "false" and not tray.is_visible()
    assert session.errors == []


def test_move_on_a_replica_is_reachable_on_a_phone(phone: Callable[[str], Session]) -> None:
    session = phone("operator")
    page = session.page
    status, body = session.api("GET", "/api/v1/deployments/?limit=500")
    assert status == 200
    placed = [d for d in body["results"] if d["placed_replicas"]]
    assert placed, "the demo fleet has a placed deployment"
    page.goto(f"{session.stack.url}/deployments/{placed[0]['id']}/")
    session.wait_live()
    move = page.locator('#replicas [data-action="move"]').first
    move.scroll_into_view_if_needed()
    box = move.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    assert box["height"] >= 24
    move.tap()
    dialog = page.locator("dialog[open]")
    dialog.wait_for(timeout=10_000)
    box = dialog.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    assert session.errors == []
