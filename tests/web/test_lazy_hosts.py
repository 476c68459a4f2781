"""A fleet too large to draw whole: the first screen's cards, a summary per host for the rest,
their cards drawn on request, and searches matched by the server across the whole fleet."""

from __future__ import annotations

import re

import pytest

from fleet.inventory.models import Gpu, Host
from fleet.web.presenters_fleet_hosts import FIRST_SCREEN_GPUS, LAZY_AFTER_GPUS
from tests.web.seed import seed_fleet

pytestmark = pytest.mark.django_db

HOSTS = LAZY_AFTER_GPUS // 8 + 4  # just past the size drawn whole


def cards(html: str) -> int:
    return html.count('<article class="gpu')


def undrawn(html: str) -> list[str]:
    return re.findall(r'<section [^>]*data-host="(\d+)"[^>]* data-lazy>', html)


@pytest.fixture
def large_fleet(db) -> list[int]:
    return seed_fleet(hosts=HOSTS)


def test_a_large_fleet_draws_its_first_screen_and_summarises_every_other_host(
    viewer_web, large_fleet
):
    html = viewer_web.get("/").content.decode()
    assert cards(html) == FIRST_SCREEN_GPUS
    assert len(undrawn(html)) == HOSTS - FIRST_SCREEN_GPUS // 8
    assert html.count("· 8 GPUs</span>") == HOSTS
    assert f'data-total="{HOSTS * 8}" data-shown="{HOSTS * 8}"' in html
    # each placeholder is named by its host's heading and says what it stands for
    last = Host.objects.order_by("-name").first()
    assert last is not None
    assert f'aria-labelledby="host-{last.pk}-name"' in html
    assert "8 GPUs shown here: their cards are drawn when this host scrolls into view" in html


def test_a_small_fleet_is_drawn_whole(viewer_web):
    seed_fleet(hosts=3)
    html = viewer_web.get("/").content.decode()
    assert cards(html) == 24 and not undrawn(html) and " data-lazy>" not in html


def test_undrawn_hosts_get_their_cards_from_the_cards_fragment(
    viewer_web, large_fleet, django_assert_max_num_queries
):
    host = Host.objects.order_by("-name").first()
    assert host is not None
    html = viewer_web.get(f"/ui/cards?host={host.pk}&drawn={host.pk}").content.decode()
    assert cards(html) == 8 and not undrawn(html)
    batch = ",".join(str(pk) for pk in Host.objects.values_list("pk", flat=True)[:16])
    with django_assert_max_num_queries(16):  # a batch costs what one host does
        html = viewer_web.get(f"/ui/cards?host={batch}&drawn={batch}").content.decode()
    assert cards(html) == 16 * 8
    matched = viewer_web.get(f"/ui/cards?host={host.pk}&drawn={host.pk}&mode=mps").content
    assert 0 < cards(matched.decode()) < 8


def test_a_change_to_an_undrawn_host_redraws_only_its_summary(viewer_web, large_fleet):
    gpu = Gpu.objects.order_by("-host__name", "index").first()
    assert gpu is not None
    html = viewer_web.get(f"/ui/cards?gpu={gpu.pk}&drawn=").content.decode()
    assert cards(html) == 0 and undrawn(html) == [str(gpu.host_id)]
    drawn = viewer_web.get(f"/ui/cards?gpu={gpu.pk}&drawn={gpu.host_id}").content.decode()
    assert cards(drawn) == 1


def test_a_changed_card_keeps_its_host_summary_whole(viewer_web):
    ids = seed_fleet(hosts=2)
    html = viewer_web.get(f"/ui/cards?gpu={ids[0]}").content.decode()
    assert cards(html) == 1
    assert "· 8 GPUs</span>" in html  # the host's, not the one card's


def test_a_search_is_matched_across_the_whole_fleet_not_only_what_is_drawn(viewer_web, large_fleet):
    last = Host.objects.order_by("-name").first()
    assert last is not None
    html = viewer_web.get("/ui/hosts", {"q": last.name}).content.decode()
    assert f'id="host-{last.pk}"' in html and cards(html) == 8
    assert f'data-total="{HOSTS * 8}" data-shown="8"' in html
    assert " data-lazy>" not in html  # few enough to draw whole
    everything = viewer_web.get("/ui/hosts").content.decode()
    assert cards(everything) == FIRST_SCREEN_GPUS and "data-lazy" in everything
