"""Apply on a deployment's defrag proposal, in a real browser against ``manage.py demo``: a
4g.40gb replica fits on no H100 until a 1g.10gb replica moves out of its way (make before
break), and Apply on the deployment page does exactly that, then places it.

The test sets its own stage on a free dedicated H100 (MIG with one 1g.10gb at slice 0, where
the only 4g.40gb placement starts; its host labelled so that the 4g.40gb deployment may run
nowhere else, whatever other tests left free) and puts everything back afterwards.

Run: ``.venv/bin/pytest tests/browser/test_defrag.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytestmark = pytest.mark.browser

H100 = "h100-sxm5-80gb"


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout} s: {what}")


def _placed(session: Any, **query: int) -> list[dict[str, Any]]:
    params = "&".join(f"{k}={v}" for k, v in query.items())
    _, body = session.api("GET", f"/api/v1/allocations/?{params}&limit=100")
    return [a for a in body["results"] if a["state"] != "releasing"]


def _free_dedicated_h100(session: Any) -> tuple[int, int]:
    """A healthy, free dedicated H100 on a ready demo host whose agent runs processes (other
    tests add hosts of their own that are none of these)."""
    _, hosts = session.api("GET", "/api/v1/hosts/?limit=500")
    usable = {
        h["id"]
        for h in hosts["results"]
        if h["status"] == "ready" and h.get("runtime") in ("process", "docker")
    }
    _, gpus = session.api("GET", "/api/v1/gpus/?limit=500")
    for gpu in gpus["results"]:
        free = (
            gpu["mode"] == "dedicated"
            and not gpu["cordoned"]
            and gpu["health"] == "healthy"
            and gpu["host"] in usable
        )
        if gpu["product_key"] == H100 and free and not _placed(session, gpu=gpu["id"]):
            return int(gpu["id"]), int(gpu["host"])
    raise AssertionError("the demo fleet has no free dedicated H100")


def _deploy(session: Any, name: str, profile: str, **extra: Any) -> int:
    workload = {"runtime": "process", "command": ["/bin/sleep", "3600"], "stop_grace_s": 2}
    status, created = session.api(
        "POST",
        "/api/v1/deployments/",
        {
            "name": name,
            "kind": "mig",
            "profile": profile,
            "auto": False,
            "workload": workload,
            **extra,
        },
    )
    assert status == 201, created
    return int(created["id"])


@contextmanager
def moves_stage(session: Any, name: str) -> Iterator[tuple[int, int, int]]:
    """A free dedicated H100 in MIG mode with one 1g.10gb at slice 0 (where the only 4g.40gb
    placement starts), a 1g.10gb replica running there, and a 4g.40gb deployment that may run
    on that GPU's host only: it fits once the small one moves. Yields (GPU, small, big); puts
    everything back afterwards."""
    stage, host = _free_dedicated_h100(session)
    _, before_labels = session.api("GET", f"/api/v1/hosts/{host}/")
    labels = dict(before_labels["labels"])
    status, _ = session.api(
        "PATCH", f"/api/v1/hosts/{host}/", {"labels": {**labels, f"{name}-test": "stage"}}
    )
    assert status == 200
    status, layout = session.api(
        "PUT",
        f"/api/v1/gpus/{stage}/layout",
        {"mode": "mig", "instances": [{"profile": "1g.10gb", "start": 0}]},
    )
    assert status in (200, 202), layout
    small = _deploy(session, f"{name}-small", "1g.10gb")
    big = _deploy(session, f"{name}-big", "4g.40gb", host_labels={f"{name}-test": "stage"})
    try:
        status, placed = session.api("POST", f"/api/v1/deployments/{small}/place", {"gpu": stage})
        assert status == 202, placed
        _wait(
            lambda: [
                a for a in _placed(session, deployment=small) if a["workload_state"] == "running"
            ],
            40,
            "the small replica running on the staged GPU",
        )
        yield stage, small, big
    finally:
        for deployment in (big, small):
            session.api("DELETE", f"/api/v1/deployments/{deployment}/")
        _wait(lambda: not _placed(session, gpu=stage), 30, "the staged GPU empty again")
        session.api("PUT", f"/api/v1/gpus/{stage}/layout", {"mode": "dedicated"})
        session.api("PATCH", f"/api/v1/hosts/{host}/", {"labels": labels})


def test_apply_on_a_defrag_proposal_moves_a_replica_and_places_the_waiting_one(
    new_session: Any,
) -> None:
    session = new_session("operator")
    page = session.page
    with moves_stage(session, "defrag") as (stage, small, big):
        [before] = _placed(session, deployment=small)
        page.goto(f"{session.stack.url}/deployments/{big}/")
        session.wait_live()
        page.locator("#defrag-show").click()
        plan = page.locator("#defrag-plan")
        plan.locator("ol li").first.wait_for(timeout=15_000)
        # GPUs by name, never by id (issue 27).
        name = page.evaluate(
            "async (id) => (await (await fetch(`/ui/gpu-names?id=${id}`)).json()).names[id]",
            stage,
        )
        assert f"Move a replica (allocation {before['id']}) from {name} to " in plan.inner_text()
        assert f"Then the replica fits on {name}." in plan.inner_text()

        page.locator("#defrag-apply").click()
        plan.filter(has_text="Applying: operation").wait_for(timeout=10_000)

        def big_placed() -> list[dict[str, Any]]:
            return _placed(session, deployment=big)

        [where] = _wait(big_placed, 90, "the waiting replica placed after the move")
        assert where["gpu"] == stage
        [after] = _placed(session, deployment=small)
        assert after["gpu"] != stage and after["workload_state"] == "running"
        assert session.errors == []
