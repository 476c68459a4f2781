"""A fleet of 1,000 GPUs: the fleet view costs a fixed number of queries and stays compact."""

from __future__ import annotations

import time

import pytest

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
    assert html.count('<article class="gpu') == 1000
    # Compact cards: the whole page stays around a few KB per GPU.
    assert len(html) / 1000 < 4000, len(html)
    assert elapsed < 15, elapsed


def test_a_changed_frame_refetches_only_the_cards_it_names(operator_web):
    ids = seed_fleet(hosts=4)
    html = operator_web.get(f"/ui/cards?gpu={ids[0]},{ids[9]}").content.decode()
    assert html.count('<article class="gpu') == 2
