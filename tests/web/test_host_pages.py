"""The host pages: the list and one host, for viewers and operators; its GPUs link to their
pages; maintenance (a scheduled drain, a running one) is shown; the fragments the live script
re-fetches; the header links to the list."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.allocations.maintenance import host_cordon, host_drain
from fleet.inventory.models import Host
from tests.factories import GpuFactory, HostFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def host():
    host = HostFactory(
        name="h100-a01",
        runtime="process",
        agent_version="0.9.1",
        driver_version="550.54.15",
        labels={"zone": "a", "example.com/rack": "r7"},
        last_seen_at=timezone.now() - timedelta(seconds=30),
    )
    GpuFactory(host=host, index=0)
    GpuFactory(host=host, index=1)
    return host


def test_the_hosts_list_shows_each_host_with_its_agent_gpus_and_labels(viewer_web, host):
    HostFactory(name="fresh", status="offline")
    response = viewer_web.get("/hosts/")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count("<h1") == 1
    assert f'href="/hosts/{host.pk}/"' in html
    for text in ("0.9.1", "Processes", "550.54.15", "zone=a", "example.com/rack=r7", "2x "):
        assert text in html, text
    assert "fresh" in html and "never" in html
    assert 'href="/hosts/" aria-current="page"' in html
    assert 'role="region" aria-label="Hosts table" tabindex="0"' in html


def test_a_host_page_shows_its_facts_gpus_labels_and_operations(viewer_web, host):
    host_cordon(host_id=host.pk)
    response = viewer_web.get(f"/hosts/{host.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count("<h1") == 1
    gpus = list(host.gpus.order_by("index"))
    for gpu in gpus:
        assert f'href="/gpus/{gpu.pk}/"' in html
    assert 'data-status="cordoned"' in html
    assert "Cordoned host h100-a01" in html  # its operations
    assert "zone=a" in html
    # Viewers see no maintenance actions and no labels form.
    assert 'data-action="cordon"' not in html and 'id="labels-form"' not in html
    assert "your role is viewer" in html


def test_an_operator_gets_the_maintenance_actions_and_the_labels_form(operator_web, host):
    html = operator_web.get(f"/hosts/{host.pk}/").content.decode()
    for action in ("cordon", "uncordon", "drain"):
        assert f'data-action="{action}"' in html
    assert '<label for="drain-at">' in html and 'id="drain-at"' in html
    assert '<label for="labels-input">' in html
    assert "example.com/rack=r7\nzone=a" in html


def test_a_scheduled_drain_is_shown_on_the_host_and_in_the_list(viewer_web, host):
    at = timezone.now() + timedelta(days=2)
    host_drain(host_id=host.pk, at=at)
    page = viewer_web.get(f"/hosts/{host.pk}/").content.decode()
    assert "Drain scheduled for" in page and at.strftime("%Y-%m-%d %H:%M") in page
    listing = viewer_web.get("/hosts/").content.decode()
    assert "drain at" in listing


def test_the_live_fragments_render_the_rows_and_the_panel(viewer_web, host):
    rows = viewer_web.get("/ui/host-rows").content.decode()
    assert f'id="host-row-{host.pk}"' in rows and "data-sig=" in rows
    Host.objects.filter(pk=host.pk).update(status="maintenance")
    panel = viewer_web.get(f"/ui/hosts/{host.pk}/panel").content.decode()
    for part in ("host-head", "host-maint", "host-gpus", "host-labels", "host-side"):
        assert f'id="{part}"' in panel
    assert "In maintenance" in panel


def test_an_unknown_host_is_a_404(viewer_web, host):
    assert viewer_web.get("/hosts/999999/").status_code == 404
    assert viewer_web.get("/ui/hosts/999999/panel").status_code == 404


def test_the_fleet_view_links_each_host_to_its_page(viewer_web, host):
    html = viewer_web.get("/").content.decode()
    assert f'href="/hosts/{host.pk}/"' in html


def test_a_reserved_host_says_for_which_teams_and_admins_get_the_form(
    viewer_web, admin_user, operator_web, host
):
    from django.test import Client

    from fleet.core.teams import team_create
    from fleet.inventory.reservations import host_set_reservation

    team_create(name="team-b")
    team_create(name="team-a")
    unreserved = viewer_web.get(f"/hosts/{host.pk}/").content.decode()
    assert "Reserved for" not in unreserved
    host_set_reservation(host_id=host.pk, teams=["team-b", "team-a"])

    page = viewer_web.get(f"/hosts/{host.pk}/").content.decode()
    assert "<dt>Reserved for</dt>" in page and ">team-a, team-b</dd>" in page
    assert 'id="reserve-form"' not in page
    panel = viewer_web.get(f"/ui/hosts/{host.pk}/panel").content.decode()
    assert ">team-a, team-b</dd>" in panel  # the live refresh shows a change
    assert 'id="reserve-form"' not in operator_web.get(f"/hosts/{host.pk}/").content.decode()
    admin = Client()
    admin.force_login(admin_user)
    form = admin.get(f"/hosts/{host.pk}/").content.decode()
    assert 'id="reserve-form"' in form and 'value="team-a, team-b"' in form
