"""The tray in a real browser: what fits now, and Place all (run with ``-m browser``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

GROUP_OF = """(id) => {
  let node = document.getElementById(id);
  while (node && node.tagName !== 'H3') node = node.previousElementSibling;
  return node ? node.dataset.section : null;
}"""


def deployment_named(session: Any, name: str) -> dict[str, Any]:
    status, body = session.api("GET", "/api/v1/deployments/?limit=500")
    assert status == 200
    return next(d for d in body["results"] if d["name"] == name)


def test_place_all_places_the_replicas_that_fit_and_the_tray_follows(
    new_session: Any, screenshots: Path
) -> None:
    session = new_session("operator")
    page = session.page
    # The demo's llama-3-8b-chat (MIG 1g.10gb) has replicas to place and free 1g.10gb slices.
    llama = deployment_named(session, "llama-3-8b-chat")
    unplaced = llama["replicas"] - llama["placed_replicas"]
    assert unplaced > 0
    dep_id = f"dep-{llama['id']}"
    dep = page.locator(f"#{dep_id}")
    assert page.evaluate(GROUP_OF, dep_id) == "unplaced"
    assert re.search(r"fit now", dep.locator(".dep-fit").inner_text())
    assert "best: " in dep.locator(".fit-best").inner_text()
    page.screenshot(path=str(screenshots / "tray-fits-now.png"))

    dep.get_by_role("button", name=re.compile(r"^Place all replicas of llama-3-8b-chat")).click()

    # The tray redraws from the live updates: the deployment is fully placed, nothing is left.
    page.wait_for_function(
        "(id) => { const d = document.getElementById(id);"
        " return d && d.dataset.placeable === '0'; }",
        arg=dep_id,
        timeout=30_000,
    )
    assert page.evaluate(GROUP_OF, dep_id) == "placed"
    after = deployment_named(session, "llama-3-8b-chat")
    assert after["placed_replicas"] == llama["replicas"]
    assert (
        page.locator(f"#{dep_id} .dep-meta")
        .inner_text()
        .startswith(f"{llama['replicas']}/{llama['replicas']} placed")
    )
    assert page.locator(".toast.error").count() == 0
    assert session.errors == []
    page.screenshot(path=str(screenshots / "tray-after-place-all.png"))


def test_a_viewer_sees_what_fits_without_a_place_all_button(new_session: Any) -> None:
    session = new_session("viewer")
    page = session.page

    fits = page.locator("#tray-list .dep .fit-count")
    assert fits.count() >= 1  # the demo has more deployments with room left
    assert page.get_by_role("button", name=re.compile("^Place all")).count() == 0
    assert session.errors == []
