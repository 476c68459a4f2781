"""``GET /capacity/advice`` starts the CP-SAT solver (seconds of several threads): operators
only, one solve per user per ``FLEET_ADVICE_MIN_INTERVAL_SECONDS``, one at a time per process."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.allocations.planning import advice
from tests.factories import GpuFactory
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

URL = "/api/v1/capacity/advice"
H100 = {"product": "h100-sxm5-80gb"}


@pytest.fixture
def h100s() -> None:
    GpuFactory()
    GpuFactory()


@pytest.fixture
def solves(monkeypatch) -> list[str]:
    """The advisor's calls, counted (the real one still answers)."""
    calls: list[str] = []
    real = advice.capacity_advice

    def counted(*, product: str, **kwargs: Any) -> Any:
        calls.append(product)
        return real(product=product, **kwargs)

    monkeypatch.setattr(advice, "capacity_advice", counted)
    return calls


def test_viewers_may_not_start_the_solver(h100s, viewer_client, solves):
    assert_error(viewer_client.get(URL, H100), 403, "auth.forbidden")
    assert solves == []


def test_a_second_solve_within_the_interval_is_429_with_retry_after(
    h100s, operator_client, admin_client, solves, settings
):
    settings.FLEET_ADVICE_MIN_INTERVAL_SECONDS = 30
    assert operator_client.get(URL, H100).status_code == 200
    again = operator_client.get(URL, H100)
    assert_error(again, 429, "throttled")
    assert 0 < int(again["Retry-After"]) <= 30
    assert solves == ["h100-sxm5-80gb"]
    # Per user: another operator may still ask.
    assert admin_client.get(URL, H100).status_code == 200


def test_a_refused_query_does_not_count_against_the_interval(
    h100s, operator_client, solves, settings
):
    settings.FLEET_ADVICE_MIN_INTERVAL_SECONDS = 30
    assert_error(operator_client.get(URL, {"product": "nope"}), 400, "advice.unknown_product")
    assert_error(operator_client.get(URL, {**H100, "time_limit_s": 99}), 400)
    assert operator_client.get(URL, H100).status_code == 200


def test_no_interval_when_the_setting_is_zero(h100s, operator_client, solves, settings):
    settings.FLEET_ADVICE_MIN_INTERVAL_SECONDS = 0
    for _ in range(2):
        assert operator_client.get(URL, H100).status_code == 200
    assert len(solves) == 2


def test_a_solve_while_another_runs_is_429_busy_with_retry_after(
    h100s, operator_client, admin_client, monkeypatch
):
    """The second request comes while the first one's solver runs (from inside it: one
    thread, one test database)."""
    answers: list[Any] = []
    real = advice.capacity_advice

    def solving(*, product: str, **kwargs: Any) -> Any:
        answers.append(admin_client.get(URL, H100))
        return real(product=product, **kwargs)

    monkeypatch.setattr(advice, "capacity_advice", solving)
    assert operator_client.get(URL, {**H100, "time_limit_s": 2}).status_code == 200
    (busy,) = answers
    assert_error(busy, 429, "advice.busy")
    assert 1 <= int(busy["Retry-After"]) <= 3
    # The lock is released: the admin may ask now (and is not held back by the busy answer).
    monkeypatch.setattr(advice, "capacity_advice", real)
    assert admin_client.get(URL, H100).status_code == 200


def test_the_schema_documents_the_refusals(viewer_client):
    paths = viewer_client.get("/api/schema/", {"format": "json"}).json()["paths"]
    answers = paths["/api/v1/capacity/advice"]["get"]["responses"]
    assert {"200", "400", "401", "403", "429"} <= set(answers)
    assert "advice.busy" in answers["429"]["description"]


def test_the_concurrency_setting_lets_that_many_solves_run_at_once(
    h100s, operator_client, admin_client, monkeypatch, settings
):
    settings.FLEET_ADVISOR_CONCURRENCY = 2
    answers: list[Any] = []
    asked: list[bool] = []
    real = advice.capacity_advice

    def solving(*, product: str, **kwargs: Any) -> Any:
        if not asked:  # the first solve asks for a second one while it runs
            asked.append(True)
            answers.append(admin_client.get(URL, {**H100, "time_limit_s": 1}))
        return real(product=product, **kwargs)

    monkeypatch.setattr(advice, "capacity_advice", solving)
    assert operator_client.get(URL, {**H100, "time_limit_s": 1}).status_code == 200
    assert [a.status_code for a in answers] == [200]
