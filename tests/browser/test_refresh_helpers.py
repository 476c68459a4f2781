"""core.js's refresh helpers in a real browser, on the hosts page: refreshRows keeps the rows
whose data-sig is unchanged (with their state) and replaces the others; refreshParts copies a
part's content only where it changed, keeping the part itself, and says how the server answered.

Run: ``.venv/bin/pytest tests/browser/test_refresh_helpers.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.browser

# The page's own copy of core.js (a module is evaluated once per URL), imported beside hosts.js.
IMPORT_CORE = (
    "await import(new URL('core.js', document.querySelector('script[src*=\"hosts.js\"]').src).href)"
)

REFRESH_ROWS = f"""async () => {{
  const {{ refreshRows }} = {IMPORT_CORE};
  const body = document.getElementById("hosts-body");
  const empty = document.getElementById("hosts-empty");
  const [kept, stale] = body.children;
  kept.dataset.state = "kept";
  stale.dataset.sig = "stale";
  stale.dataset.state = "stale";
  const read = await refreshRows("/ui/host-rows", body, "tr.host-row", {{ empty }});
  const unread = await refreshRows("/ui/no-such-rows", body, "tr.host-row", {{ empty }});
  return {{
    read, unread,
    keptStays: body.children[0] === kept && kept.dataset.state === "kept",
    staleReplaced: !stale.isConnected && body.children[1].dataset.sig !== "stale",
    rows: body.children.length,
    emptyHidden: empty.hidden,
  }};
}}"""

REFRESH_PARTS = f"""async () => {{
  const {{ refreshParts }} = {IMPORT_CORE};
  const HEAD = "#hosts-page .page-head";  // no live content: no race with the page's refreshes
  const head = document.querySelector(HEAD);
  const wanted = head.innerHTML;
  head.dataset.state = "kept";
  head.querySelector("h1").textContent = "edited here";
  const answered = await refreshParts(location.pathname, [HEAD, "#no-such-part"]);
  return {{
    answered,
    partStays: document.querySelector(HEAD) === head && head.dataset.state === "kept",
    contentBack: head.innerHTML === wanted,
    missing: await refreshParts("/hosts/999999/", [HEAD]),
  }};
}}"""


def test_refresh_rows_keeps_the_rows_whose_signature_is_unchanged(new_session: Any) -> None:
    session = new_session("viewer")
    page = session.page
    page.goto(f"{session.stack.url}/hosts/")
    session.wait_live()
    rows = page.locator("#hosts-body tr.host-row").count()
    assert rows >= 2

    outcome = page.evaluate(REFRESH_ROWS)

    assert outcome == {
        "read": True,
        "unread": False,
        "keptStays": True,
        "staleReplaced": True,
        "rows": rows,
        "emptyHidden": True,
    }
    assert session.errors == []


def test_refresh_parts_copies_a_changed_part_into_the_page_and_says_how_the_server_answered(
    new_session: Any,
) -> None:
    session = new_session("viewer")
    page = session.page
    page.goto(f"{session.stack.url}/hosts/")
    session.wait_live()

    outcome = page.evaluate(REFRESH_PARTS)

    assert outcome == {
        "answered": {"ok": True, "status": 200},
        "partStays": True,
        "contentBack": True,
        "missing": {"ok": False, "status": 404},
    }
