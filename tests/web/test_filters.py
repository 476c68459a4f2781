"""One GPU filter: the API's ``/gpus/`` list, the fleet page's server-side filtering and the
browser's rules (the page config's match kinds on the cards' data-* attributes) keep the same
GPUs for every filter, so their meanings cannot drift apart."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from fleet.inventory.filters import GPU_FILTER_NAMES, GPU_FILTERS

pytestmark = pytest.mark.django_db

CASES = [
    {"q": "llama-chat"},
    {"q": "h100-x01 gpu1"},
    {"q": "3G.40GB"},
    {"q": "a30"},
    {"q": "embed"},
    {"q": "nothing-like-this"},
    {"mode": "mig"},
    {"mode": "mps"},
    {"mode": "dedicated"},
    {"product": "H100"},
    {"product": "NVIDIA A30"},
    {"product": "a30"},
    {"health": "healthy"},
    {"health": "unhealthy"},
    {"health": "lost"},
    {"cordoned": "true"},
    {"cordoned": "false"},
    {"cordoned": "1"},
    {"free": "true"},
    {"free": "false"},
    {"free": "1", "mode": "mps"},
    {"product": "H100", "free": "true", "q": "h100-x01"},
]


@pytest.fixture
def mixed_fleet(small_fleet) -> dict[str, Any]:
    """``small_fleet`` (MIG with a replica, MPS, dedicated H100s) plus an MPS share on the MPS
    GPU, a cordoned and unhealthy A30, and a lost L4."""
    from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
    from fleet.inventory.models import Gpu, GpuHealth
    from tests.factories import GpuFactory, HostFactory

    embed = deployment_create(
        name="embed", request=DeploymentRequest(kind="mps", memory_mib=4096), replicas=1
    )
    deployment_place(deployment_id=embed.pk, gpu_id=small_fleet["mps"].pk)
    other = HostFactory(name="a30-y01")
    a30 = GpuFactory(host=other, index=0, product_key="a30-24gb")
    Gpu.objects.filter(pk=a30.pk).update(
        health=GpuHealth.UNHEALTHY, cordoned=True, cordon_reason="xid 79"
    )
    l4 = GpuFactory(host=other, index=1, product_key="l4-24gb")
    Gpu.objects.filter(pk=l4.pk).update(health=GpuHealth.LOST)
    return {**small_fleet, "a30": a30, "l4": l4}


def api_ids(client: Any, params: dict[str, str]) -> set[int]:
    response = client.get("/api/v1/gpus/", {**params, "limit": 500})
    assert response.status_code == 200, response.content
    return {g["id"] for g in response.json()["results"]}


def page_ids(client: Any, params: dict[str, str]) -> set[int]:
    html = client.get("/", params).content.decode()
    return {int(i) for i in re.findall(r'<article class="gpu[^"]*" id="gpu-(\d+)"', html)}


def page_config(html: str) -> dict[str, Any]:
    found = re.search(r'<script id="page-config" type="application/json">(.*?)</script>', html)
    assert found, "the page has no config"
    return dict(json.loads(found.group(1)))


def card_attributes(html: str) -> dict[int, dict[str, str]]:
    cards = {}
    for tag in re.findall(r'<article class="gpu[^>]*>', html):
        attributes = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag))
        cards[int(attributes["gpu"])] = attributes
    return cards


def browser_rule(match: str, have: str, want: str, choices: list[list[str]]) -> bool:
    """The match kinds as static/web/fleet/filters.js applies them (what the config documents)."""
    if match == "terms":
        return all(term in have.lower() for term in want.lower().split())
    if match == "exact":
        return have == want or not any(value == want for value, _ in choices)
    if match == "contains":
        return want.lower() in have.lower()
    if want.lower() in ("true", "1"):
        return have == "1"
    if want.lower() in ("false", "0"):
        return have == "0"
    return True


def browser_ids(html: str, params: dict[str, str]) -> set[int]:
    filters = {f["name"]: f for f in page_config(html)["gpu_filters"]}
    return {
        gpu
        for gpu, attributes in card_attributes(html).items()
        if all(
            browser_rule(
                filters[name]["match"],
                attributes[filters[name]["attr"]],
                value,
                filters[name]["choices"],
            )
            for name, value in params.items()
        )
    }


@pytest.mark.parametrize("params", CASES, ids=lambda p: "&".join(f"{k}={v}" for k, v in p.items()))
def test_the_api_the_page_and_the_browser_rules_keep_the_same_gpus(
    params, mixed_fleet, viewer_client, viewer_web
):
    expected = api_ids(viewer_client, params)
    assert page_ids(viewer_web, params) == expected
    everything = viewer_web.get("/").content.decode()
    assert browser_ids(everything, params) == expected


def test_the_filters_mean_what_their_help_says(mixed_fleet, viewer_client):
    ids = {name: mixed_fleet[name].pk for name in ("mig", "mps", "whole", "a30", "l4")}
    assert api_ids(viewer_client, {"free": "true"}) == {ids["whole"], ids["a30"], ids["l4"]}
    assert api_ids(viewer_client, {"health": "unhealthy"}) == {ids["a30"]}  # not the lost L4
    assert api_ids(viewer_client, {"product": "h100"}) == {ids["mig"], ids["mps"], ids["whole"]}
    assert api_ids(viewer_client, {"q": "embed"}) == {ids["mps"]}  # a deployment's name
    assert api_ids(viewer_client, {"q": "gpu1 h100"}) == {ids["mps"]}
    assert api_ids(viewer_client, {"cordoned": "true"}) == {ids["a30"]}


def test_an_unknown_value_is_refused_by_the_api_and_ignored_by_the_page(
    mixed_fleet, viewer_client, viewer_web
):
    response = viewer_client.get("/api/v1/gpus/", {"mode": "sideways"})
    assert response.status_code == 400
    assert page_ids(viewer_web, {"mode": "sideways"}) == page_ids(viewer_web, {})


def test_the_page_reads_only_the_gpus_that_match(mixed_fleet, viewer_web):
    html = viewer_web.get("/", {"health": "lost"}).content.decode()
    assert page_ids(viewer_web, {"health": "lost"}) == {mixed_fleet["l4"].pk}
    assert '<div class="stat"><span class="k">GPUs</span><span class="v">5</span>' in html


def test_the_filter_controls_are_drawn_from_the_filter_choices(mixed_fleet, viewer_web):
    html = viewer_web.get("/", {"health": "lost", "cordoned": "true"}).content.decode()
    for spec in GPU_FILTERS:
        assert f'name="{spec.name}"' in html
        for value, label in spec.choices:
            assert f'value="{value}"' in html and label in html
    assert '<option value="lost" selected>Lost</option>' in html
    assert re.search(r'name="cordoned" value="true" checked', html)
    for product in ("NVIDIA A30", "NVIDIA L4", mixed_fleet["mig"].product_name):
        assert f'<option value="{product}" >{product}</option>' in html
    config = page_config(html)
    assert [f["name"] for f in config["gpu_filters"]] == list(GPU_FILTER_NAMES)
