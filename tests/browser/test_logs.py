"""Replica logs on the deployment page, in a real browser against ``manage.py demo`` (whose agents
run workloads as real processes and answer logs requests over their sockets): opening the panel
shows a line the workload printed; Follow brings newer lines without a click; a viewer reads them
too.

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


def _running_printer(session: Any, name: str) -> tuple[int, int]:
    status, free = session.api(
        "GET", "/api/v1/partitions/?kind=mig&free=true&profile_name=1g.10gb&limit=10"
    )
    assert status == 200 and free["results"], free
    status, created = session.api(
        "POST",
        "/api/v1/deployments/",
        {"name": name, "kind": "mig", "profile": "1g.10gb", "workload": PRINTER},
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
    return [int(n) for n in re.findall(r"^tick (\d+)$", text, re.M)]


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
                  .matchAll(/^tick (\\d+)$/gm)].some((m) => Number(m[1]) > seen + 1)""",
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
