"""The capacity page in a real browser against the running demo stack: it answers "what would
fit" questions with the API's numbers, and says why a question cannot be answered.

Run: ``.venv/bin/pytest tests/browser/test_capacity.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser


def test_the_capacity_page_answers_what_would_fit_for_the_demo_fleet(
    new_session: Any, screenshots: Path
) -> None:
    session = new_session("viewer")
    page = session.page
    page.goto(f"{session.stack.url}/capacity/")
    session.wait_live()
    assert page.get_by_role("heading", level=1).inner_text() == "Capacity"
    assert page.locator("table.cap-table").count() >= 1

    profile = page.get_by_label("Profile").input_value()
    status, expected = session.api("GET", f"/api/v1/capacity/?kind=mig&profile={profile}", None)
    assert status == 200, expected
    page.get_by_role("button", name="Ask").click()
    answer = page.locator("#cap-answer")
    wanted = expected["request"]
    text = (
        f"{wanted['fits_now']} replica{'' if wanted['fits_now'] == 1 else 's'} of a {profile} "
        f"instance"
    )
    answer.filter(has_text=text).wait_for(timeout=10_000)
    assert f"{wanted['fits_if_idle_reshaped']} after reshaping idle instances" in (
        answer.inner_text()
    )

    page.get_by_label("Request").select_option("mps")
    page.get_by_label("Memory (MiB)").fill("2048")
    page.get_by_role("button", name="Ask").click()
    answer.filter(has_text="MPS share of 2048 MiB").wait_for(timeout=10_000)
    status, mps = session.api("GET", "/api/v1/capacity/?kind=mps&memory_mib=2048", None)
    assert re.match(rf"{mps['request']['fits_now']} replicas? of a MPS share", answer.inner_text())

    page.get_by_label("Memory (MiB)").fill("")
    page.get_by_role("button", name="Ask").click()
    page.locator('#cap-answer[data-state="error"]').wait_for(timeout=10_000)
    assert "memory_mib" in answer.inner_text() and "(invalid)" in answer.inner_text()
    page.screenshot(path=str(screenshots / "capacity.png"), full_page=True)
    assert session.errors == []


def test_the_capacity_page_follows_a_placement_without_a_reload(
    new_session: Any, settled_fleet: Any, admin_token: str
) -> None:
    session = new_session("viewer")
    page = session.page
    page.goto(f"{session.stack.url}/capacity/")
    session.wait_live()
    _, body = session.api("GET", "/api/v1/capacity/", None)
    profile = next(
        p["profile"]
        for product in body["products"]
        for p in product["mig"]["profiles"]
        if p["fits_now"] > 0
    )
    count = """(profile) => [...document.querySelectorAll(`tr[data-profile="${profile}"]`)]
        .reduce((sum, row) => sum + Number(row.querySelector("td.num").textContent), 0)"""
    before = page.evaluate(count, profile)
    page.evaluate("() => { window.__sameDocument = true; }")

    status, deployment = settled_fleet.api(
        "POST",
        "/api/v1/deployments/",
        admin_token,
        {"name": "capacity-follow", "kind": "mig", "profile": profile, "auto": True},
    )
    assert status == 201, deployment
    try:
        page.wait_for_function(
            f"(profile) => ({count})(profile) === {before - 1}", arg=profile, timeout=15_000
        )
        assert page.evaluate("() => window.__sameDocument === true")
    finally:
        settled_fleet.api("DELETE", f"/api/v1/deployments/{deployment['id']}/", admin_token)
    assert session.errors == []


def test_waiting_replicas_get_a_layout_proposal_an_operator_can_apply(
    new_session: Any, settled_fleet: Any, admin_token: str, screenshots: Path
) -> None:
    _, capacity = settled_fleet.api("GET", "/api/v1/capacity/", admin_token)
    product = next(
        p for p in capacity["products"] if p["mig"]["profiles"] and p["schedulable_gpus"]
    )
    # More replicas of the largest profile than fit now: some wait.
    largest = product["mig"]["profiles"][0]["profile"]
    status, deployment = settled_fleet.api(
        "POST",
        "/api/v1/deployments/",
        admin_token,
        {"name": "advice-waits", "kind": "mig", "profile": largest, "replicas": 3},
    )
    assert status == 201, deployment
    try:
        session = new_session("operator")
        page = session.page
        sent: list[Any] = []

        def fake_rollout(route: Any) -> None:
            # The page's POST is checked here and answered without reshaping the shared fleet.
            sent.append(route.request.post_data_json)
            route.fulfill(status=202, json={"id": 4242, "summary": "Layout rollout"})

        page.route("**/api/v1/rollouts/", fake_rollout)
        page.goto(f"{session.stack.url}/capacity/")
        session.wait_live()
        section = page.get_by_role("region", name="Layout advice")
        assert "not placed" in section.inner_text()
        page.locator("#advice-product").select_option(product["product_key"])
        # The page's own answer: a second solve may pick other layouts of the same worth.
        with page.expect_response(lambda r: "/api/v1/capacity/advice" in r.url) as answered:
            page.get_by_role("button", name="Propose layouts").click()
        assert answered.value.status == 200
        advice = answered.value.json()
        answer = page.locator('#advice-answer[data-state="ok"]')
        answer.wait_for(timeout=20_000)
        assert f"of {advice['waiting_replicas']} waiting" in answer.inner_text()
        assert "gap to the bound" in answer.inner_text()
        if advice["rollout"] is not None:
            rows = page.locator("#advice-table tbody tr")
            assert rows.count() == len(advice["gpus"])
            native: list[str] = []
            page.on("dialog", lambda dialog: (native.append(dialog.message), dialog.dismiss()))
            # The one confirm dialog, stating the impact; Cancel sends nothing.
            page.get_by_role("button", name="Apply as rollout").click()
            confirm = page.get_by_role("alertdialog")
            count = len(advice["rollout"]["layouts"])
            assert confirm.get_by_role("heading").inner_text().startswith(f"Reshape {count} GPU")
            moved = sum(g["moved_replicas"] for g in advice["gpus"] if g["drained"])
            impact = confirm.locator(".confirm-impact").inner_text()
            assert ("no running replica moves" in impact) == (moved == 0), impact
            confirm.get_by_role("button", name="Cancel").click()
            page.wait_for_timeout(300)
            assert sent == [] and confirm.count() == 0
            page.get_by_role("button", name="Apply as rollout").click()
            page.get_by_role("alertdialog").get_by_role("button", name="Reshape").click()
            page.get_by_text("Rollout 4242 started").wait_for(timeout=10_000)
            assert native == []
            assert sent and sent[0]["layouts"] == advice["rollout"]["layouts"]
        page.screenshot(path=str(screenshots / "capacity_advice.png"), full_page=True)
        assert session.errors == []
    finally:
        settled_fleet.api("DELETE", f"/api/v1/deployments/{deployment['id']}/", admin_token)
