"""Issue 27: no console error and no failed request on any page, for each role.

One tab per role (admin, operator, viewer, and a team member without a fleet role) walks every
page its main menu offers, then a deployment, a host, a GPU, its layout editor and a team. Every
console error, uncaught exception, failed request and answer of 400 or more is collected with
the page it happened on; the test fails on the first page that has one.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

pytestmark = pytest.mark.browser

MEMBER = "console-member"
# The pages every role is offered (Alerts only to admins), besides the detail pages.
MENU = {
    "/",
    "/hosts/",
    "/deployments/",
    "/capacity/",
    "/teams/",
    "/usage/",
    "/rollouts/",
    "/operations/",
}


@pytest.fixture(scope="module")
def member(settled_fleet: Any) -> str:
    """A user whose only role is operator of the team ``default``."""
    password = secrets.token_urlsafe(12)
    settled_fleet.manage(
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model; "
        "from fleet.core.models import Team, TeamMembership; "
        f"u = get_user_model().objects.create_user({MEMBER!r}, password={password!r}); "
        "TeamMembership.objects.create(team=Team.objects.get(slug='default'), user=u, "
        "role='operator')",
    )
    settled_fleet.passwords[MEMBER] = password
    return MEMBER


class Watch:
    """What went wrong in a tab, by page."""

    def __init__(self, page: Any) -> None:
        self.where = "login"
        self.problems: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self._add(f"uncaught: {error}"))
        page.on("requestfailed", self._failed)
        page.on("response", self._response)

    def _add(self, problem: str) -> None:
        self.problems.append(f"{self.where}: {problem}")

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self._add(f"console error: {message.text}")

    def _failed(self, request: Any) -> None:
        # Leaving a page cancels what it still had in flight: not a failure of the page.
        if request.failure != "net::ERR_ABORTED":
            self._add(f"{request.method} {request.url} failed: {request.failure}")

    def _response(self, response: Any) -> None:
        if response.status >= 400:
            self._add(f"{response.request.method} {response.url} answered {response.status}")


def _detail_pages(session: Any) -> list[str]:
    pages = []
    for path, link in (
        ("/api/v1/deployments/?limit=1", "/deployments/{}/"),
        ("/api/v1/hosts/?limit=1", "/hosts/{}/"),
        ("/api/v1/gpus/?limit=1", "/gpus/{}/"),
        ("/api/v1/gpus/?limit=1", "/gpus/{}/layout/"),
        ("/api/v1/teams/?limit=1", "/teams/{}/"),
    ):
        status, body = session.api("GET", path)
        assert status == 200 and body["results"], (path, status, body)
        pages.append(link.format(body["results"][0]["id"]))
    return pages


@pytest.mark.parametrize("role", ["admin", "operator", "viewer", "member"])
def test_no_page_logs_an_error_or_fails_a_request(
    chromium: Any, settled_fleet: Any, member: str, role: str
) -> None:
    from tests.browser.conftest import Session

    username = member if role == "member" else role
    context = chromium.new_context(viewport={"width": 1440, "height": 900})
    try:
        page = context.new_page()
        watch = Watch(page)
        session = Session(page, settled_fleet).login(username)
        menu = {
            href
            for href in page.locator(".mainnav a").evaluate_all(
                "links => links.map(a => a.getAttribute('href'))"
            )
            if not href.startswith("/api/")
        }
        assert menu == (MENU | {"/alerts/"} if role == "admin" else MENU), menu
        for path in [*sorted(menu), *_detail_pages(session)]:
            watch.where = path
            page.goto(settled_fleet.url + path)
            if page.locator("#live-status").count():
                session.wait_live()
            page.wait_for_load_state("networkidle", timeout=15_000)
            assert watch.problems == [], watch.problems
    finally:
        context.close()
