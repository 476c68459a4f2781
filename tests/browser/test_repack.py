"""The capacity page's repack proposal in a real browser against ``manage.py demo``: the plan
(moves, cost, bound, method) as the API gives it, Apply moving a replica off the GPU it empties,
and the fleet view outlining the GPUs involved.

Run: ``.venv/bin/pytest tests/browser/test_repack.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = pytest.mark.browser


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout} s: {what}")


def _a_plan_that_moves_replicas(session: Any) -> dict[str, Any]:
    """The first product of the demo fleet where emptying one GPU moves a replica."""
    _, capacity = session.api("GET", "/api/v1/capacity/")
    for product in capacity["products"]:
        status, plan = session.api(
            "GET", f"/api/v1/capacity/repack?product={product['product_key']}&free_gpus=1"
        )
        assert status == 200, plan
        if plan["feasible"] and plan["cost"] >= 1:
            return plan
    raise AssertionError("no product of the demo fleet has a repack that moves a replica")


def _placed_on(session: Any, gpu: int) -> list[dict[str, Any]]:
    _, body = session.api("GET", f"/api/v1/allocations/?gpu={gpu}&limit=100")
    return [a for a in body["results"] if a["state"] != "releasing"]


def test_apply_on_a_repack_proposal_moves_a_replica_and_empties_the_gpu(
    new_session: Any,
) -> None:
    session = new_session("operator")
    page = session.page
    expected = _a_plan_that_moves_replicas(session)
    page.goto(f"{session.stack.url}/capacity/")
    session.wait_live()

    page.locator("#repack-product").select_option(expected["product_key"])
    page.get_by_label("GPUs to free").fill("1")
    page.get_by_role("button", name="Propose", exact=True).click()
    plan = page.locator("#repack-plan")
    plan.locator(".repack-summary").wait_for(timeout=20_000)
    assert (
        plan.locator(".repack-method")
        .inner_text()
        .startswith("CP-SAT" if expected["method"] == "cp-sat" else "greedy")
    )
    cost = int(plan.locator(".repack-cost").inner_text())
    assert int(plan.locator(".repack-bound").inner_text()) <= cost
    assert plan.locator(".repack-moves li").count() >= cost >= 1
    assert plan.locator(".repack-moves li").first.inner_text().startswith(("Move", "Destroy"))
    emptied = int(
        plan.locator("#repack-highlight").get_attribute("href").split("=")[1].split(",")[0]
    )
    before = {a["id"] for a in _placed_on(session, emptied)}
    assert before, "the GPU to empty holds a replica"

    page.get_by_role("button", name="Apply").click()
    page.locator('#repack-plan[data-state="done"], #repack-plan[data-state="error"]').wait_for(
        timeout=90_000
    )
    assert plan.get_attribute("data-state") == "done", plan.inner_text()
    assert "GPU(s) freed" in plan.inner_text()
    _wait(lambda: not _placed_on(session, emptied), 30, "the emptied GPU holds no replica")
    _, moves = session.api("GET", "/api/v1/operations/?kind=move&limit=20")
    moved = [m for m in moves["results"] if m["payload"].get("from_allocation") in before]
    assert moved and all(m["status"] == "succeeded" for m in moved)
    assert session.errors == []


def test_the_fleet_view_outlines_the_gpus_of_a_proposal(new_session: Any) -> None:
    session = new_session("viewer")
    page = session.page
    _, gpus = session.api("GET", "/api/v1/gpus/?limit=2")
    first, second = (g["id"] for g in gpus["results"])
    page.goto(f"{session.stack.url}/?highlight={first},{second}")
    session.wait_live()

    note = page.locator("#highlight-note")
    note.wait_for(state="visible", timeout=10_000)
    assert note.inner_text() == "2 GPUs of the repack proposal outlined."
    outline = "(id) => getComputedStyle(document.getElementById(`gpu-${id}`)).outlineStyle"
    assert page.evaluate(outline, first) == "solid"
    assert page.evaluate(outline, second) == "solid"
    others = page.locator("article.gpu").nth(5).evaluate("(e) => getComputedStyle(e).outlineStyle")
    assert others == "none"
    assert session.errors == []
