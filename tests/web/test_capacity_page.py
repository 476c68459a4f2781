"""The capacity page: per product what fits now and after a reshape, MPS and whole-GPU room, the
host heat strip with its table, and the "what would fit" form; its panel fragment re-renders."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db


def profile_row(html: str, profile: str) -> list[str]:
    row = re.search(rf'<tr data-profile="{re.escape(profile)}">(.*?)</tr>', html, re.S)
    assert row is not None, profile
    return re.findall(r'<td class="num">(\d+)</td>', row.group(1))


@pytest.mark.parametrize("persona", ["viewer_web", "operator_web"])
def test_the_capacity_page_shows_each_profile_now_and_after_a_reshape(
    request, persona, small_fleet
):
    html = request.getfixturevalue(persona).get("/capacity/").content.decode()

    # The balanced layout: 1g.10gb at 0 and 1 and 2g.20gb at 2 are idle, 3g.40gb at 4 is busy.
    assert profile_row(html, "1g.10gb") == ["2", "4"]
    assert profile_row(html, "2g.20gb") == ["1", "2"]
    assert profile_row(html, "3g.40gb") == ["0", "1"]
    assert "NVIDIA H100 80GB HBM3" in html


def test_the_page_is_accessible_markup(viewer_web, small_fleet):
    html = viewer_web.get("/capacity/").content.decode()

    assert html.count("<h1") == 1
    assert 'href="/capacity/" aria-current="page"' in html
    for control in ("cap-kind", "cap-profile", "cap-memory", "cap-compute", "cap-gpus"):
        assert f'<label for="{control}"' in html and f'id="{control}"' in html
    assert '<th scope="col">Fits now</th>' in html and '<th scope="row">1g.10gb</th>' in html
    # The heat strip says each host's share in text; the per-host table has the figures.
    assert '<ol class="cap-strip" aria-label="Fragmented share of each host' in html
    assert '<span class="cap-strip-host">h100-x01</span>' in html
    assert '<th scope="row">h100-x01</th>' in html
    assert 'role="status" aria-live="polite"' in html


def test_the_form_offers_the_fleets_mig_profiles(viewer_web, small_fleet):
    html = viewer_web.get("/capacity/").content.decode()
    assert '<option value="1g.10gb+me">1g.10gb+me</option>' in html


def test_the_panel_fragment_re_renders_the_numbers(viewer_web, small_fleet):
    response = viewer_web.get("/ui/capacity")
    html = response.content.decode()
    assert response.status_code == 200 and "no-cache" in response["Cache-Control"]
    assert profile_row(html, "1g.10gb") == ["2", "4"]
    assert "<h1" not in html


def test_anonymous_users_are_sent_to_the_login_page(client, small_fleet):
    for url in ("/capacity/", "/ui/capacity"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/"), url


def test_every_page_links_to_capacity_in_the_header(viewer_web, small_fleet):
    assert 'href="/capacity/"' in viewer_web.get("/operations/").content.decode()


def test_the_repack_form_offers_the_fleets_products_and_operators_the_pace(
    viewer_web, operator_web, small_fleet
):
    viewer = viewer_web.get("/capacity/").content.decode()
    operator = operator_web.get("/capacity/").content.decode()

    for control in ("repack-product", "repack-count"):
        assert f'<label for="{control}"' in viewer and f'id="{control}"' in viewer
    assert '<option value="h100-sxm5-80gb">NVIDIA H100 80GB HBM3</option>' in viewer
    assert 'id="repack-plan" class="cap-answer" role="status"' in viewer
    assert 'src="/static/web/repack.js"' in viewer
    assert 'id="repack-unavailable"' in operator and 'id="repack-unavailable"' not in viewer


def test_the_fleet_view_has_a_status_line_for_highlighted_gpus(viewer_web, small_fleet):
    html = viewer_web.get("/?highlight=1,2").content.decode()
    assert '<p class="muted small highlight-note" id="highlight-note" role="status" hidden>' in html


def test_no_advice_section_while_no_replica_waits(viewer_web, small_fleet):
    from fleet.allocations.models import Deployment

    Deployment.objects.filter(name="llama-chat").update(replicas=1)  # its one placed replica
    html = viewer_web.get("/capacity/").content.decode()
    assert 'id="cap-advice"' not in html


@pytest.mark.parametrize(("persona", "can_ask"), [("viewer_web", False), ("operator_web", True)])
def test_waiting_replicas_bring_the_advisor_and_operators_may_ask_and_apply_it(
    request, persona, can_ask, small_fleet
):
    from fleet.allocations.services import DeploymentRequest, deployment_create

    deployment_create(
        name="waits", request=DeploymentRequest(kind="mig", profile="4g.40gb"), replicas=2
    )
    html = request.getfixturevalue(persona).get("/capacity/").content.decode()
    # llama-chat's second replica waits too.
    assert 'id="cap-advice"' in html and "3 replicas are not placed" in html
    # The deployments by status, in the tray's and the API's words: both wait.
    assert re.search(r'data-status="waiting">.*?<strong>2</strong> waiting, no capacity', html)
    # Asking runs the solver: operators only (the API refuses viewers, 403).
    assert ('<label for="advice-product"' in html) is can_ask
    offered = '<option value="h100-sxm5-80gb">NVIDIA H100 80GB HBM3</option>'
    assert (f'<select id="advice-product" name="product">{offered}' in html) is can_ask
    assert ("Apply as rollout" in html) is can_ask
    assert ("An operator can ask the advisor" in html) is not can_ask


def matrix_cell(html: str, profile: str) -> tuple[str, str, str]:
    cell = re.search(
        rf'<td class="cap-cell" data-state="(\w+)" data-matrix-profile="{re.escape(profile)}".*?'
        r'<strong class="cap-now-n">(\d+)</strong> / <span class="cap-later-n">(\d+)</span>',
        html,
        re.S,
    )
    assert cell is not None, profile
    return cell.group(1), cell.group(2), cell.group(3)


def test_the_matrix_at_the_top_shows_each_products_profiles_now_and_after_a_reshape(
    viewer_web, small_fleet
):
    html = viewer_web.get("/capacity/").content.decode()

    # Above the forms: the product chooser, then the matrix.
    position = html.index
    assert position('id="cap-choose"') < position('id="cap-matrix"') < position('id="cap-form"')
    assert '<th scope="col" data-product="h100-sxm5-80gb">NVIDIA H100 80GB HBM3' in html
    # The same numbers as the per-product table (the balanced layout of small_fleet).
    assert matrix_cell(html, "1g.10gb") == ("now", "2", "4")
    assert matrix_cell(html, "3g.40gb") == ("reshape", "0", "1")
    assert '<th scope="row">1g \u00b7 more memory</th>' in html  # 1g.20gb


def test_choosing_a_product_shows_only_it_and_its_profiles(viewer_web, small_fleet, db):
    from tests.factories import GpuFactory, HostFactory

    GpuFactory(host=HostFactory(name="a30-x02"), product_key="a30-24gb", product_name="NVIDIA A30")
    every = viewer_web.get("/capacity/").content.decode()
    assert '<option value="a30-24gb">NVIDIA A30</option>' in every
    assert '<option value="1g.6gb">1g.6gb</option>' in every

    html = viewer_web.get("/capacity/?product=h100-sxm5-80gb").content.decode()

    assert '<option value="h100-sxm5-80gb" selected>' in html
    assert 'data-product="a30-24gb"' not in html
    assert '<option value="1g.6gb">' not in html and '<option value="1g.10gb">' in html
    fragment = viewer_web.get("/ui/capacity?product=h100-sxm5-80gb").content.decode()
    assert 'id="cap-matrix"' in fragment and 'id="cap-products"' in fragment
    assert 'data-product="a30-24gb"' not in fragment


def test_an_unknown_product_shows_every_product(viewer_web, small_fleet):
    response = viewer_web.get("/capacity/?product=%3Cscript%3E")
    html = response.content.decode()
    assert response.status_code == 200
    assert " selected>" not in html.split('id="cap-choose"')[1].split("</form>")[0]
    assert "<script>" not in html and "%3Cscript" not in html
    assert matrix_cell(html, "1g.10gb") == ("now", "2", "4")
