"""A fleet of 1,000 GPUs: the fleet view costs a fixed number of queries and stays compact."""

from __future__ import annotations

import time

import pytest

from fleet.web.presenters_fleet_hosts import FIRST_SCREEN_GPUS
from tests.web.seed import seed_fleet

pytestmark = pytest.mark.django_db


def test_the_fleet_view_of_1000_gpus_costs_a_fixed_number_of_queries(
    operator_web, django_assert_max_num_queries
):
    ids = seed_fleet(hosts=125)
    assert len(ids) == 1000
    started = time.perf_counter()
    with django_assert_max_num_queries(20):
        response = operator_web.get("/")
    elapsed = time.perf_counter() - started
    html = response.content.decode()
    # The first screen's cards, and every other host as its summary: the page stays compact.
    assert html.count('<section class="host') == 125
    assert 0 < html.count('<article class="gpu') <= FIRST_SCREEN_GPUS
    assert len(html) < 400_000, len(html)
    assert elapsed < 15, elapsed
    with django_assert_max_num_queries(22):  # filtered: the matching GPUs, the fleet's summary
        filtered = operator_web.get("/", {"mode": "mig", "q": "bulk-00 3g", "free": "true"})
    assert 0 < filtered.content.decode().count('<article class="gpu') < 1000


def test_a_changed_frame_refetches_only_the_cards_it_names(operator_web):
    ids = seed_fleet(hosts=4)
    html = operator_web.get(f"/ui/cards?gpu={ids[0]},{ids[9]}").content.decode()
    assert html.count('<article class="gpu') == 2
