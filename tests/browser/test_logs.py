"""Replica logs on the deployment page, in a real browser against ``manage.py demo`` (whose agents
run workloads as real processes and answer logs requests over their sockets): opening the panel
shows a line the workload printed; Follow, on by default, brings newer lines without a click and
keeps the view at the bottom until the user scrolls up; each line shows when its agent captured
it; older lines load on demand until there are none; a search filters and highlights the loaded
lines; Wrap toggles; Download saves the loaded lines as text. A viewer reads them too.

Run: ``.venv/bin/pytest tests/browser -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

pytestmark = pytest.mark.browser

PRINTER = {
    "runtime": "process",
    "command": [
        "/bin/sh",
        "-c",
        "echo 'hello from the logs panel'; i=0; "
        'while :; do i=$((i+1)); echo "tick $i"; sleep 1; done',
    ],
    "stop_grace_s": 2,
}


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def _running_printer(session: Any, name: str, workload: Any = PRINTER) -> tuple[int, int]:
    status, free = session.api(
        "GET", "/api/v1/partitions/?kind=mig&free=true&profile_name=1g.10gb&limit=10"
    )
    assert status == 200 and free["results"], free
    status, created = session.api(
        "POST",
        "/api/v1/deployments/",
        {"name": name, "kind": "mig", "profile": "1g.10gb", "workload": workload},
    )
    assert status == 201, created
    status, op = session.api(
        "POST",
        f"/api/v1/deployments/{created['id']}/place",
        {"partition": free["results"][0]["id"]},
    )
    assert status == 202, op

    def running() -> int | None:
        _, body = session.api("GET", f"/api/v1/allocations/?deployment={created['id']}")
        rows = [a for a in body["results"] if a["workload_state"] == "running"]
        return int(rows[0]["id"]) if rows else None

    return int(created["id"]), _wait(running, 30, "the replica running")


def _ticks(text: str) -> list[int]:
    return [int(n) for n in re.findall(r" tick (\d+)$", text, re.M)]


def test_the_deployment_page_shows_what_a_replica_printed_and_follows_it(new_session: Any) -> None:
    operator = new_session("operator")
    deployment_id, allocation_id = _running_printer(operator, "log-printer")
    try:
        viewer = new_session("viewer")
        page = viewer.page
        page.goto(f"{viewer.stack.url}/deployments/{deployment_id}/")
        viewer.wait_live()
        page.locator("#dep-logs > summary").click()
        assert page.locator("#logs-replica").input_value() == str(allocation_id)
        output = page.locator("#logs-output")
        assert output.get_attribute("aria-live") == "polite"
        page.wait_for_function(
            "() => document.getElementById('logs-output').textContent"
            ".includes('hello from the logs panel')",
            timeout=15_000,
        )
        assert page.locator("#logs-error").is_hidden()
        seen = max(_ticks(output.inner_text()), default=0)

        page.get_by_label("Follow").check()
        page.wait_for_function(
            """(seen) => [...document.getElementById('logs-output').textContent
                  .matchAll(/ tick (\\d+)$/gm)].some((m) => Number(m[1]) > seen + 1)""",
            arg=seen,
            timeout=15_000,
        )
        # Closed, the panel stops asking.
        page.locator("#dep-logs > summary").click()
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url) if "/logs" in r.url else None)
        page.wait_for_timeout(4500)
        assert requests == []
        assert viewer.errors == []
    finally:
        operator.api("DELETE", f"/api/v1/deployments/{deployment_id}/")


CHATTY = {
    "runtime": "process",
    "command": [
        "/bin/sh",
        "-c",
        'i=0; while [ $i -lt 450 ]; do i=$((i+1)); echo "boot $i"; done; i=0; '
        'while :; do i=$((i+1)); echo "tick $i"; sleep 0.5; done',
    ],
    "stop_grace_s": 2,
}

AT_BOTTOM = "(o) => o.scrollTop + o.clientHeight >= o.scrollHeight - 4"


def test_the_log_viewer_follows_pages_back_searches_wraps_and_downloads(
    new_session: Any, tmp_path: Any
) -> None:
    operator = new_session("operator")
    deployment_id, _ = _running_printer(operator, "log-viewer", CHATTY)
    try:
        viewer = new_session("viewer")
        page = viewer.page
        page.goto(f"{viewer.stack.url}/deployments/{deployment_id}/")
        viewer.wait_live()
        page.locator("#dep-logs > summary").click()
        output = page.locator("#logs-output")
        follow = page.get_by_label("Follow")
        assert follow.is_checked()  # follow by default
        page.wait_for_function(
            "() => document.getElementById('logs-output').textContent.includes(' tick ')",
            timeout=15_000,
        )
        seen = max(_ticks(output.inner_text()))
        page.wait_for_function(  # newer lines without a click, the view kept at the bottom
            """(seen) => [...document.getElementById('logs-output').textContent
                  .matchAll(/ tick (\\d+)$/gm)].some((m) => Number(m[1]) > seen + 2)""",
            arg=seen,
            timeout=15_000,
        )
        assert output.evaluate(AT_BOTTOM)
        # Each line shows the time its agent captured it, seconds ago.
        stamp = page.locator("#logs-output time[datetime]").last.get_attribute("datetime")
        assert stamp is not None and re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", stamp)
        assert abs(page.evaluate("(t) => Date.now() - Date.parse(t)", stamp)) < 60_000

        # Scrolling up pauses Follow: the lines stay put.
        output.evaluate("(o) => { o.scrollTop = 0; }")
        page.wait_for_function("() => !document.getElementById('logs-follow').checked")
        page.wait_for_timeout(2500)
        assert output.evaluate("(o) => o.scrollTop") == 0

        # Older lines on demand, 200 at a time, until the first line the replica printed.
        older = page.get_by_role("button", name="Load 200 older lines")
        assert older.is_visible() and "boot 1\n" not in output.text_content()
        loaded = page.locator("#logs-output .log-line").count()
        older.click()
        page.wait_for_function(
            "(n) => document.querySelectorAll('#logs-output .log-line').length > n", arg=loaded
        )
        assert page.locator("#logs-output .log-line").count() == loaded + 200
        for _ in range(3):
            if older.is_hidden():
                break
            count = page.locator("#logs-output .log-line").count()
            older.click()
            page.wait_for_function(
                "(n) => document.querySelectorAll('#logs-output .log-line').length > n",
                arg=count,
            )
        assert older.is_hidden()
        first = page.locator("#logs-output .log-line").first.inner_text().strip()
        assert first.endswith(" boot 1")
        assert page.locator("#logs-older-note").is_hidden()  # none gone: all were kept

        # Search: the loaded lines that match, the match marked.
        page.locator("#logs-search").fill("BOOT 42")
        marks = page.locator("#logs-output mark")
        assert marks.count() == 11  # boot 42, boot 420..429
        assert set(marks.all_inner_texts()) == {"boot 42"}
        assert page.locator("#logs-matches").inner_text().startswith("11 of ")
        page.locator("#logs-search").fill("")
        assert marks.count() == 0

        # Wrap is on by default; off, long lines scroll sideways.
        assert output.evaluate("(o) => getComputedStyle(o).whiteSpace") == "pre-wrap"
        page.get_by_label("Wrap lines").uncheck()
        assert output.evaluate("(o) => getComputedStyle(o).whiteSpace") == "pre"

        # Download: the loaded lines as text, each after its time.
        lines = page.locator("#logs-output .log-line").count()
        with page.expect_download() as download:
            page.get_by_role("button", name="Download .txt").click()
        assert download.value.suggested_filename.startswith("log-viewer-replica-")
        saved = tmp_path / "logs.txt"
        download.value.save_as(saved)
        text = saved.read_text().splitlines()
        assert len(text) == lines
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z boot 1", text[0]), text[0]

        # Follow again: back to the bottom, newer lines coming.
        follow.check()
        page.wait_for_function(f"() => ({AT_BOTTOM})(document.getElementById('logs-output'))")
        assert viewer.errors == []
    finally:
        operator.api("DELETE", f"/api/v1/deployments/{deployment_id}/")
