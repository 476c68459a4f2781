"""Moving a running replica in the fleet view, in a real browser against ``manage.py demo``
(whose agents run workloads as real processes): a drag from one slice to another is a move,
make before break, and the keyboard alternative is focus, Enter, then a target.

Run: ``.venv/bin/pytest tests/browser -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = pytest.mark.browser

SLEEPER = {"runtime": "process", "command": ["/bin/sleep", "3600"], "stop_grace_s": 2}


def _free_1g(session: Any) -> list[dict[str, Any]]:
    status, body = session.api(
        "GET", "/api/v1/partitions/?kind=mig&free=true&profile_name=1g.10gb&limit=500"
    )
    assert status == 200, body
    return list(body["results"])


def _allocations(session: Any, deployment_id: int) -> list[dict[str, Any]]:
    status, body = session.api("GET", f"/api/v1/allocations/?deployment={deployment_id}")
    assert status == 200
    return list(body["results"])


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def _running_replica(session: Any, name: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """A deployment of one running process replica, and a free slice on another GPU."""
    free = _free_1g(session)
    source = free[0]
    target = next(p for p in free if p["gpu"] != source["gpu"])
    status, created = session.api(
        "POST",
        "/api/v1/deployments/",
        {"name": name, "kind": "mig", "profile": "1g.10gb", "workload": SLEEPER},
    )
    assert status == 201, created
    status, op = session.api(
        "POST", f"/api/v1/deployments/{created['id']}/place", {"partition": source["id"]}
    )
    assert status == 202, op
    _wait(
        lambda: [
            a for a in _allocations(session, created["id"]) if a["workload_state"] == "running"
        ],
        30,
        "the replica running",
    )
    return int(created["id"]), source, target


def _moved(session: Any, deployment_id: int, target: dict[str, Any]) -> bool:
    rows = _allocations(session, deployment_id)
    return (
        len(rows) == 1
        and rows[0]["partition"] == target["id"]
        and rows[0]["workload_state"] == "running"
    )


def _cleanup(session: Any, deployment_id: int) -> None:
    session.api("DELETE", f"/api/v1/deployments/{deployment_id}/")


def test_dragging_a_running_replica_to_another_slice_moves_it(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    deployment_id, source, target = _running_replica(session, "drag-mover")
    try:
        (old,) = _allocations(session, deployment_id)
        replica = page.locator(f'[data-allocation="{old["id"]}"]')
        replica.wait_for(timeout=15_000)
        assert replica.get_attribute("draggable") == "true"
        slot = page.locator(f'.slice[data-partition="{target["id"]}"]')

        def moves() -> list[dict[str, Any]]:
            _, ops = session.api("GET", f"/api/v1/operations/?kind=move&deployment={deployment_id}")
            return list(ops["results"])

        # Live changes are held back while the gesture lasts, so one drag is enough.
        slot.scroll_into_view_if_needed()
        replica.drag_to(slot)
        _wait(moves, 10, "a move requested")
        _wait(lambda: _moved(session, deployment_id, target), 40, "the replica moved")
        # The page shows it running on its new slice, and the old slice free.
        page.wait_for_function(
            """([pid, old]) => {
              const s = document.querySelector(`.slice[data-partition="${pid}"]`);
              const o = document.querySelector(`.slice[data-partition="${old}"]`);
              return !!s && !!s.querySelector('[data-workload="running"]')
                && !!o && !o.classList.contains('used');
            }""",
            arg=[target["id"], source["id"]],
            timeout=20_000,
        )
        status, ops = session.api(
            "GET", f"/api/v1/operations/?kind=move&deployment={deployment_id}"
        )
        assert status == 200 and ops["results"][0]["status"] == "succeeded", ops
        assert page.locator(".toast.error").count() == 0
        assert session.errors == []
    finally:
        _cleanup(session, deployment_id)


def test_the_keyboard_moves_a_replica_too(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    deployment_id, _, target = _running_replica(session, "key-mover")
    try:
        (old,) = _allocations(session, deployment_id)
        replica = page.locator(f'[data-allocation="{old["id"]}"]')
        replica.wait_for(timeout=15_000)
        replica.focus()
        page.keyboard.press("Enter")
        dialog = page.locator("#place-dialog")
        assert dialog.locator("#place-title").inner_text().startswith("Move key-mover")
        dialog.locator(f'button[data-gpu="{target["gpu"]}"]').click()
        _wait(
            lambda: (
                (rows := _allocations(session, deployment_id))
                and len(rows) == 1
                and rows[0]["gpu"] == target["gpu"]
                and rows[0]["workload_state"] == "running"
            ),
            40,
            "the replica moved to the chosen GPU",
        )
        assert session.errors == []
    finally:
        _cleanup(session, deployment_id)


def test_a_viewer_cannot_drag_a_replica(new_session: Any) -> None:
    session = new_session("viewer")
    page = session.page
    used = page.locator(".slice.used [data-allocation]").first
    used.wait_for(timeout=15_000)
    assert used.get_attribute("draggable") is None
