"""The real stack for browser tests: ``manage.py demo`` (the ASGI server plus simulated agents) on
a free loopback port with its own data directory, and Debian's chromium driven by Playwright.

Run them in their own process (Playwright's sync API keeps an asyncio loop in the main thread,
which breaks the ORM and ``async_to_sync`` in other tests)::

    .venv/bin/pytest tests/browser -m browser -p no:cacheprovider

Screenshots go to ``artifacts/screenshots/`` (or ``FLEET_SCREENSHOT_DIR``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.bench.processes import free_port, wait_until
from fleet.bench.stack import ROOT, Stack
from tests.sso.oidc_provider import sso_env

__all__ = ["ROOT", "Session", "Stack", "free_port"]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SKIP_REASON = (
    "browser tests run in their own pytest process: "
    "pytest tests/browser -m browser -p no:cacheprovider (or set FLEET_BROWSER_TESTS=1)"
)


def _selected_on_purpose(config: pytest.Config) -> bool:
    markexpr = (config.getoption("markexpr", "") or "").replace(" ", "")
    return ("browser" in markexpr and "notbrowser" not in markexpr) or os.environ.get(
        "FLEET_BROWSER_TESTS"
    ) == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the browser tests unless ``-m browser`` (or FLEET_BROWSER_TESTS=1) asked for them."""
    if _selected_on_purpose(config):
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


def drag_over(page: Any, source: Any, card: Any, fit: str | None = None) -> None:
    """Drags ``source`` over a GPU ``card`` as a person does and holds it there until the
    drag's fit preview has marked the card (``data-fit``, or that value when ``fit`` is
    given): the dragstart ran and its targets came back. The mouse stays down: the caller
    drops with ``page.mouse.up()`` (:func:`drop_once_previewed`). A drop in the same instant as
    the press (Playwright's ``drag_to``) can be lost on a slow machine."""
    card.scroll_into_view_if_needed()
    source.hover()
    page.mouse.down()
    box = card.locator(".gpu-head").bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y, steps=8)
    page.wait_for_function(
        "([label, fit]) => {"
        ' const f = document.querySelector(`article.gpu[data-label="${label}"]`)?.dataset.fit;'
        " return fit === null ? f !== undefined : f === fit; }",
        arg=[card.get_attribute("data-label"), fit],
        timeout=15_000,
    )
    page.mouse.move(x + 4, y, steps=2)


def drop_once_previewed(page: Any, source: Any, card: Any) -> None:
    """Drags ``source`` onto ``card`` (:func:`drag_over`) and drops it there."""
    drag_over(page, source, card)
    page.mouse.up()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """``manage.py demo`` on a free port (:class:`fleet.bench.stack.Stack`'s embedded mode): the
    ASGI server, its embedded scheduler and the simulated agents (one process group, stopped
    together)."""
    env = {
        "FLEET_IMAGE_PINNING": "false",  # the tests' images are made up: no registry is asked
        "FLEET_GATEWAY_URL": "http://gateway.test:8080",  # endpoints' URLs (no gateway runs)
        # Single sign-on through tests/sso's provider, which test_sso starts on this port
        # when it runs (discovery is lazy: nothing asks the provider before).
        **sso_env(free_port()),
    }
    running = Stack(tmp_path_factory.mktemp("fleet-demo"), env=env)
    try:
        yield running.start_demo("--no-gateway")
    finally:
        running.stop()


@pytest.fixture(scope="session")
def admin_token(stack: Stack) -> str:
    return stack.manage("create_api_token", "browser-tests-admin", "--role", "admin").split()[-1]


@pytest.fixture(scope="session")
def settled_fleet(stack: Stack, admin_token: str) -> Stack:
    """Wait until every demo host's agent has applied its desired state."""

    def applied() -> bool:
        _, hosts = stack.api("GET", "/api/v1/hosts/?limit=500", admin_token)
        rows = hosts["results"] if isinstance(hosts, dict) else hosts
        return bool(rows) and all(
            h["status"] == "ready" and h["applied_generation"] >= h["desired_generation"]
            for h in rows
        )

    wait_until(applied, 90, "the demo agents applying their desired state", every=0.5)
    return stack


@pytest.fixture(scope="session")
def screenshots() -> Path:
    folder = Path(os.environ.get("FLEET_SCREENSHOT_DIR", ROOT / "artifacts" / "screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Session:
    """A signed-in browser tab, with the console errors it saw."""

    def __init__(self, page: Any, stack: Stack) -> None:
        self.page = page
        self.stack = stack
        self.errors: list[str] = []
        page.on("pageerror", lambda error: self.errors.append(str(error)))

    def login(self, username: str) -> Session:
        self.page.goto(self.stack.url + "/login/")
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", self.stack.passwords[username])
        self.page.click("button[type=submit]")
        self.page.wait_for_url(self.stack.url + "/")
        self.wait_live()
        return self

    def wait_live(self) -> None:
        # 20 s: the 2 cores are shared with the servers, and a refused first try backs off.
        self.page.wait_for_selector('#live-status[data-state="live"]', timeout=20_000)

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """The REST API with this tab's session (as the dashboard's own script calls it)."""
        result = self.page.evaluate(
            """async ([method, path, body]) => {
                const token = document.cookie.split('; ').find(c => c.startsWith('csrftoken='));
                const response = await fetch(path, {method, credentials: 'same-origin',
                  headers: {'Content-Type': 'application/json',
                            'X-CSRFToken': token ? token.split('=')[1] : ''},
                  body: body === null ? undefined : JSON.stringify(body)});
                const text = await response.text();
                return [response.status, text ? JSON.parse(text) : null];
            }""",
            [method, path, body],
        )
        return int(result[0]), result[1]


@pytest.fixture
def new_session(chromium: Any, settled_fleet: Stack) -> Iterator[Any]:
    contexts = []

    def make(username: str, width: int = 1600, height: int = 1000) -> Session:
        context = chromium.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        return Session(context.new_page(), settled_fleet).login(username)

    yield make
    for context in contexts:
        context.close()
