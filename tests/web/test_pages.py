"""Every page renders from the server for viewers and operators; anonymous users go to the login;
operators get action controls that viewers do not."""

from __future__ import annotations

import pytest

from tests.web.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def pages(fleet):
    gpu = fleet["mig"].pk
    return ["/", f"/gpus/{gpu}/", f"/gpus/{gpu}/layout/", "/operations/"]


def test_anonymous_users_are_sent_to_the_login_page(client, small_fleet):
    for url in [*pages(small_fleet), "/ui/cards?all=1", "/ui/tray"]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url


def test_the_login_page_signs_a_user_in_and_lands_on_the_fleet(client, viewer):
    page = client.get("/login/")
    assert page.status_code == 200
    assert b"Sign in" in page.content
    response = client.post("/login/", {"username": viewer.username, "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_a_wrong_password_shows_an_error_and_signs_nobody_in(client, viewer):
    response = client.post("/login/", {"username": viewer.username, "password": "nope"})
    assert response.status_code == 200
    assert b"do not match" in response.content
    assert client.get("/").status_code == 302


def test_logout_is_a_post_that_ends_the_session(viewer_web):
    assert viewer_web.post("/logout/").status_code == 302
    assert viewer_web.get("/").status_code == 302


@pytest.mark.parametrize("persona", ["viewer_web", "operator_web"])
def test_every_page_renders_for_each_role(request, persona, small_fleet):
    client = request.getfixturevalue(persona)
    for url in pages(small_fleet):
        response = client.get(url)
        assert response.status_code == 200, url
    response = client.get("/")
    assert b'id="gpu-%d"' % small_fleet["mig"].pk in response.content


def test_the_fleet_draws_mig_instances_at_their_placements(operator_web, small_fleet):
    html = operator_web.get("/").content.decode()
    three_g = small_fleet["three_g"]
    assert f'data-partition="{three_g.pk}"' in html
    assert "grid-column:5 / span 4" in html  # 3g.40gb at slice 4, size 4 on an 8-slice grid
    assert "llama-chat" in html
    assert "idle · whole GPU" in html  # the dedicated GPU
    assert "MEM" in html and "SM" in html  # the MPS bars


def test_missing_nvml_values_read_not_available(operator_web, small_fleet):
    html = operator_web.get(f"/gpus/{small_fleet['mig'].pk}/").content.decode()
    assert "Not available" in html
    fleet = operator_web.get("/").content.decode()
    assert "n/a" in fleet


def test_operators_can_drag_and_viewers_cannot(viewer_web, operator_web, small_fleet):
    operator_html = operator_web.get("/").content.decode()
    assert 'draggable="true"' in operator_html
    assert 'data-action="place"' in operator_html
    viewer_html = viewer_web.get("/").content.decode()
    assert 'draggable="true"' not in viewer_html
    assert 'data-action="place"' not in viewer_html
    assert "viewer role" in viewer_html


def test_viewers_see_action_buttons_disabled(viewer_web, small_fleet):
    html = viewer_web.get(f"/gpus/{small_fleet['mig'].pk}/").content.decode()
    assert 'data-action="cordon" disabled' in html
    editor = viewer_web.get(f"/gpus/{small_fleet['mig'].pk}/layout/").content.decode()
    assert 'id="apply" disabled' in editor


def test_the_fleet_filters_on_the_server_too(operator_web, small_fleet):
    html = operator_web.get("/?mode=mps").content.decode()
    assert f'id="gpu-{small_fleet["mps"].pk}"' in html
    assert f'id="gpu-{small_fleet["mig"].pk}"' not in html
    html = operator_web.get("/?q=llama-chat").content.decode()
    assert f'id="gpu-{small_fleet["mig"].pk}"' in html
    assert f'id="gpu-{small_fleet["whole"].pk}"' not in html


def test_an_unknown_gpu_is_a_404(operator_web, small_fleet):
    assert operator_web.get("/gpus/999999/").status_code == 404
    assert operator_web.get("/gpus/999999/layout/").status_code == 404


def test_the_layout_editor_embeds_profiles_current_instances_and_presets(operator_web, small_fleet):
    response = operator_web.get(f"/ui/gpus/{small_fleet['mig'].pk}/editor")
    model = response.json()
    assert model["slice_count"] == 8
    assert {p["name"] for p in model["profiles"]} >= {"1g.10gb", "3g.40gb", "7g.80gb"}
    busy = [c for c in model["current"] if c["busy"]]
    assert busy == [
        {
            "partition_id": small_fleet["three_g"].pk,
            "profile_id": 9,
            "profile": "3g.40gb",
            "start": 4,
            "size": 4,
            "busy": ["llama-chat[0]"],
            "mps": None,
        }
    ]
    assert {p["key"] for p in model["presets"]} >= {"all-1g", "balanced", "whole"}


def test_the_editor_carries_each_instance_mps_policy_so_a_reshape_keeps_it(
    operator_web, small_fleet
):
    from fleet.partitioning.models import Partition

    Partition.objects.filter(pk=small_fleet["three_g"].pk).update(
        mps_enabled=True, mps_default_active_thread_percentage=40, mps_max_clients=8
    )
    model = operator_web.get(f"/ui/gpus/{small_fleet['mig'].pk}/editor").json()
    (three_g,) = [c for c in model["current"] if c["partition_id"] == small_fleet["three_g"].pk]
    assert three_g["mps"] == {
        "default_active_thread_percentage": 40,
        "default_pinned_mem_limit_mib": None,
        "max_clients": 8,
    }
    assert all(c["mps"] is None for c in model["current"] if c is not three_g)
