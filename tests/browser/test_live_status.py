"""Every page says its live socket is live (issue 27: "Connecting…" never cleared on Alerts and
Usage, which opened no socket).

Run: ``.venv/bin/pytest tests/browser/test_live_status.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.browser


@pytest.mark.parametrize(("path", "role"), [("/alerts/", "admin"), ("/usage/", "viewer")])
def test_a_page_without_live_content_still_says_live(
    new_session: Any, path: str, role: str
) -> None:
    session = new_session(role)
    session.page.goto(f"{session.stack.url}{path}")
    session.wait_live()
    assert session.page.locator("#live-status .txt").inner_text() == "Live"
    assert session.errors == []
