"""The fleet view of a fleet too large to draw whole, in a real browser: host groups drawn as
they scroll into view, a search matched by the server across the whole fleet, and placeholders
that stay accessible. The fleet is ``bench_fleet_view``'s (a seeded scratch database and its
own server), just past the size the page draws whole."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fleet.bench.fleet_view import GPUS_PER_HOST, ViewOptions, scratch_server
from fleet.web.presenters_fleet_hosts import FIRST_SCREEN_GPUS, LAZY_AFTER_GPUS
from tests.browser.test_accessibility import axe_violations, readable

pytestmark = pytest.mark.browser

GPUS = LAZY_AFTER_GPUS + 4 * GPUS_PER_HOST
HOSTS = GPUS // GPUS_PER_HOST


@pytest.fixture(scope="module")
def large_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    workdir = tmp_path_factory.mktemp("large-fleet")
    with scratch_server(workdir, GPUS, ViewOptions(sizes=[GPUS], log=lambda _: None)) as server:
        yield server


@pytest.fixture
def fleet_page(chromium: Any, large_fleet: tuple[str, str]) -> Iterator[Any]:
    url, session_key = large_fleet
    context = chromium.new_context(viewport={"width": 1600, "height": 1000}, bypass_csp=True)
    context.add_cookies([{"name": "sessionid", "value": session_key, "url": url}])
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url + "/")
    page.wait_for_selector('#live-status[data-state="live"]', timeout=10_000)
    yield page
    assert not errors
    context.close()


def test_host_groups_are_drawn_as_they_scroll_into_view(fleet_page):
    hosts = fleet_page.locator("section.host")
    assert hosts.count() == HOSTS
    assert fleet_page.locator("article.gpu").count() < GPUS
    last = hosts.last
    assert last.get_attribute("data-lazy") is not None
    last.scroll_into_view_if_needed()
    fleet_page.wait_for_function(
        "() => { const h = [...document.querySelectorAll('section.host')].pop();"
        " return !h.hasAttribute('data-lazy') && h.querySelectorAll('article.gpu').length === 8; }"
    )
    assert fleet_page.locator("#match-count").inner_text() == f"{GPUS} GPUs"


def test_a_search_draws_what_the_server_matched_beyond_what_is_drawn(fleet_page):
    last = fleet_page.locator("section.host").last
    name = last.locator("h3").text_content()  # off screen: not rendered, no innerText
    assert name
    assert last.get_attribute("data-lazy") is not None
    fleet_page.fill("#search", name)
    fleet_page.wait_for_function(
        "() => document.querySelectorAll('section.host').length === 1"
        " && document.querySelectorAll('article.gpu').length === 8"
    )
    assert fleet_page.locator("#match-count").inner_text() == f"8 of {GPUS} GPUs"
    fleet_page.fill("#search", "")
    fleet_page.wait_for_function(
        f"() => document.querySelectorAll('section.host').length === {HOSTS}"
    )
    assert fleet_page.locator("article.gpu").count() >= FIRST_SCREEN_GPUS
    assert fleet_page.locator("#match-count").inner_text() == f"{GPUS} GPUs"


def test_undrawn_host_groups_pass_axe(fleet_page):
    assert fleet_page.locator("section.host[data-lazy]").count() > 0
    violations = axe_violations(fleet_page)
    assert not violations, readable(violations)
