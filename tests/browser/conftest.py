"""The real stack for browser tests: ``manage.py demo`` (the ASGI server plus simulated agents) on
a free loopback port with its own data directory, and Debian's chromium driven by Playwright.

Run them in their own process (Playwright's sync API keeps an asyncio loop in the main thread,
which breaks the ORM and ``async_to_sync`` in other tests)::

    .venv/bin/pytest tests/browser -m browser -p no:cacheprovider

Screenshots go to ``artifacts/screenshots/`` (or ``FLEET_SCREENSHOT_DIR``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.sso.oidc_provider import sso_env

ROOT = Path(__file__).resolve().parents[2]
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Stack:
    url: str
    passwords: dict[str, str]  # each demo account has its own
    data_dir: Path
    env: dict[str, str]
    process: subprocess.Popen[str]
    log_path: Path

    def api(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        """Call the REST API as automation does (token auth), outside any browser."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            raw = error.read()
            return error.code, json.loads(raw) if raw else None

    def manage(self, *args: str) -> str:
        """Run a management command against the stack's database."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.strip()


def _wait_for_http(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer in time")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """``manage.py demo`` on a free port: the ASGI server, its embedded scheduler and the
    simulated agents (one process group, stopped together)."""
    data_dir = tmp_path_factory.mktemp("fleet-data")
    port = free_port()
    env = {
        **os.environ,
        "FLEET_DATA_DIR": str(data_dir),
        "DJANGO_SETTINGS_MODULE": "fleet.settings.base",
        "PYTHONUNBUFFERED": "1",
        "FLEET_IMAGE_PINNING": "false",  # the tests' images are made up: no registry is asked
        "FLEET_GATEWAY_URL": "http://gateway.test:8080",  # endpoints' URLs (no gateway runs)
        # Single sign-on through tests/sso's provider, which test_sso starts on this port
        # when it runs (discovery is lazy: nothing asks the provider before).
        **sso_env(free_port()),
    }
    env.pop("FLEET_DATABASE_URL", None)
    env.pop("FLEET_REDIS_URL", None)
    log_path = data_dir / "server.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--addr", f"127.0.0.1:{port}", "--no-gateway"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
    )
    passwords: dict[str, str] = {}
    deadline = time.monotonic() + 120
    assert process.stdout is not None
    while time.monotonic() < deadline and len(passwords) < 3:
        line = process.stdout.readline()
        if not line:
            break
        found = re.search(r"(admin|operator|viewer)\s+password: (\S+)", line)
        if found:
            passwords[found.group(1)] = found.group(2)
    if len(passwords) < 3:
        os.killpg(process.pid, signal.SIGTERM)
        raise RuntimeError(f"demo printed no password for every account; see {log_path}")
    url = f"http://127.0.0.1:{port}"
    _wait_for_http(url + "/healthz", deadline)
    running = Stack(url, passwords, data_dir, env, process, log_path)
    try:
        yield running
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="session")
def admin_token(stack: Stack) -> str:
    return stack.manage("create_api_token", "browser-tests-admin", "--role", "admin").split()[-1]


@pytest.fixture(scope="session")
def settled_fleet(stack: Stack, admin_token: str) -> Stack:
    """Wait until every demo host's agent has applied its desired state."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        _, hosts = stack.api("GET", "/api/v1/hosts/?limit=500", admin_token)
        rows = hosts["results"] if isinstance(hosts, dict) else hosts
        if rows and all(
            h["status"] == "ready" and h["applied_generation"] >= h["desired_generation"]
            for h in rows
        ):
            return stack
        time.sleep(0.5)
    raise RuntimeError("the demo agents did not apply their desired state in time")


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
