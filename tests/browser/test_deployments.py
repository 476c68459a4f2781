"""The deployment pages in a real browser against the running stack (ASGI server + simulated
agents that run the demo's process workloads).

Run: ``.venv/bin/pytest tests/browser/test_deployments.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

_serial = itertools.count(1)

# The demo's feature-worker, under other names so the other browser tests keep theirs.
WORKER = {
    "kind": "mps",
    "memory_mib": 2048,
    "max_compute_percent": 10,
    "replicas": 2,
    "auto": True,
    "workload": {
        "runtime": "process",
        "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
        "stop_grace_s": 5,
    },
}


@pytest.fixture
def worker(settled_fleet: Any, admin_token: str) -> Iterator[dict[str, Any]]:
    """A fresh copy per test: a deleted one keeps its name while its processes stop."""
    name = f"scale-worker-{next(_serial)}"
    status, body = settled_fleet.api(
        "POST", "/api/v1/deployments/", admin_token, {**WORKER, "name": name}
    )
    assert status == 201, body
    assert body["placed_replicas"] == 2
    yield body
    settled_fleet.api("DELETE", f"/api/v1/deployments/{body['id']}/", admin_token)


def test_an_operator_scales_a_deployment_from_its_page_without_a_reload(
    new_session: Any, worker: dict[str, Any], screenshots: Path
) -> None:
    session = new_session("operator")
    page = session.page
    page.goto(f"{session.stack.url}/deployments/{worker['id']}/")
    session.wait_live()
    assert page.locator("[data-wanted]").inner_text() == "2"
    page.evaluate("() => { window.__sameDocument = true; }")

    page.get_by_label("Replicas wanted").fill("3")
    page.get_by_role("button", name="Scale", exact=True).click()

    page.wait_for_function(
        "() => document.querySelector('[data-wanted]')?.textContent.trim() === '3'",
        timeout=15_000,
    )
    assert page.evaluate("() => window.__sameDocument === true")  # updated in place
    # Auto-placed: the engine places the third replica, and the page shows it placed.
    page.wait_for_function(
        "() => document.querySelector('[data-placed]')?.textContent.trim() === '3'",
        timeout=30_000,
    )
    assert page.locator('#replicas tbody tr[data-allocation-state="unplaced"]').count() == 0
    assert page.locator("#replicas tbody tr").count() == 3
    page.screenshot(path=str(screenshots / "deployment-scaled.png"), full_page=True)
    assert page.evaluate("() => window.__sameDocument === true")
    assert session.errors == []


def test_a_refused_scale_shows_the_api_message_and_changes_nothing(
    new_session: Any, worker: dict[str, Any]
) -> None:
    session = new_session("operator")
    page = session.page
    page.goto(f"{session.stack.url}/deployments/{worker['id']}/")
    session.wait_live()

    page.get_by_label("Replicas wanted").fill("0")
    page.get_by_role("button", name="Scale", exact=True).click()

    error = page.locator("#scale-error")
    error.wait_for(state="visible", timeout=10_000)
    assert "from 1 to 1000" in error.inner_text()
    assert page.get_by_label("Replicas wanted").get_attribute("aria-invalid") == "true"
    status, body = session.api("GET", f"/api/v1/deployments/{worker['id']}/")
    assert status == 200 and body["replicas"] == 2
    assert session.errors == []


def test_the_list_links_each_deployment_to_its_page(
    new_session: Any, worker: dict[str, Any], screenshots: Path
) -> None:
    session = new_session("viewer")
    page = session.page
    page.get_by_role("link", name="Deployments").click()
    page.wait_for_url(f"{session.stack.url}/deployments/")
    row = page.locator(f"#deployment-{worker['id']}")
    assert "2 GiB" in row.inner_text()
    page.screenshot(path=str(screenshots / "deployments.png"), full_page=True)
    row.get_by_role("link", name=worker["name"]).click()
    page.wait_for_url(f"{session.stack.url}/deployments/{worker['id']}/")
    assert page.locator("#scale-form").count() == 0  # viewers see, operators scale
    assert session.errors == []


def test_scaling_down_asks_first_and_says_how_many_running_replicas_stop(
    new_session: Any, worker: dict[str, Any]
) -> None:
    # Issue 27: "Scale-down stopped 3 running replicas with no confirmation."
    session = new_session("operator")
    page = session.page
    page.goto(f"{session.stack.url}/deployments/{worker['id']}/")
    session.wait_live()
    page.wait_for_function(
        "() => document.querySelectorAll('#replicas [data-workload=\"running\"]').length === 2",
        timeout=30_000,
    )
    page.get_by_label("Replicas wanted").fill("1")
    page.get_by_role("button", name="Scale", exact=True).click()
    # One confirm dialog states the impact; Cancel has the focus, Escape sends nothing.
    confirm = page.get_by_role("alertdialog", name=re.compile("down to 1"))
    assert "1 running replica stops" in confirm.inner_text()
    page.keyboard.press("Escape")
    confirm.wait_for(state="detached")
    status, body = session.api("GET", f"/api/v1/deployments/{worker['id']}/")
    assert status == 200 and body["replicas"] == 2  # dismissed: nothing changed

    page.get_by_role("button", name="Scale", exact=True).click()
    page.get_by_role("alertdialog").get_by_role("button", name="Scale to 1").click()
    page.wait_for_function(
        "() => document.querySelector('[data-wanted]')?.textContent.trim() === '1'",
        timeout=15_000,
    )
    assert session.errors == []
