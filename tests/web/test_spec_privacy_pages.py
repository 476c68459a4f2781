"""The pages show another team's deployment as a name, a request and slices: its image, command
line, env, logs panel and replica metrics only to its own team and to fleet viewers and up
(issue 21, H2). Webhook URLs on the operations page lose their credentials and query strings."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from fleet.core.models import OperationKind, OperationStatus, TeamMembership
from fleet.core.operations import operation_record
from tests.api.test_spec_privacy import MARKERS, two_teams

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> dict[str, Any]:
    return two_teams()


def browser_of(world: dict[str, Any], team: str, role: str) -> Client:
    user = get_user_model().objects.create_user(f"{role}-of-{team}", password="x-pass-1234")
    TeamMembership.objects.create(team=world[team], user=user, role=role)
    client = Client()
    client.force_login(user)
    return client


def pages(client: Client, world: dict[str, Any]) -> dict[str, str]:
    d = world["d"].pk
    urls = ["/deployments/", "/ui/deployments", f"/deployments/{d}/", f"/ui/deployments/{d}/panel"]
    found = {}
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        found[url] = response.content.decode()
    return found


def test_another_teams_operator_sees_the_deployment_but_not_what_it_runs(world):
    alice = browser_of(world, "alpha", "operator")
    for url, html in pages(alice, world).items():
        assert "beta-svc" in html, url
        for marker in MARKERS:
            assert marker not in html, (url, marker)
    detail = alice.get(f"/deployments/{world['d'].pk}/").content.decode()
    assert 'id="workload-hidden"' in detail
    assert 'id="dep-logs"' not in detail and 'id="replica-metrics"' not in detail
    metrics = alice.get(f"/ui/deployments/{world['d'].pk}/metrics?allocation={world['a'].pk}")
    assert metrics.status_code == 403


def test_the_teams_viewer_and_a_fleet_viewer_see_what_it_runs(world, viewer):
    fleet_viewer = Client()
    fleet_viewer.force_login(viewer)
    for client in (browser_of(world, "beta", "viewer"), fleet_viewer):
        found = pages(client, world)
        listing, detail = found["/deployments/"], found[f"/deployments/{world['d'].pk}/"]
        assert "registry.example/beta/llm:7" in listing and "beta-cmd-marker" in listing
        assert "s3cr3t-beta-v2" in detail and 'id="dep-logs"' in detail
        assert 'id="replica-metrics"' in detail and 'id="workload-hidden"' not in detail
        assert client.get(f"/ui/deployments/{world['d'].pk}/metrics").status_code == 200


def test_the_operations_page_shows_webhook_urls_without_credentials(world):
    operation_record(
        kind=OperationKind.SET_WEBHOOK,
        summary="Alert webhook #1 created: https://ops:hunter2@hooks.example.com/s/T0?token=XYZ",
        status=OperationStatus.SUCCEEDED,
        payload={"webhook": 1},
    )
    page = browser_of(world, "alpha", "viewer").get("/operations/").content.decode()
    assert "https://hooks.example.com/s/T0" in page
    assert "hunter2" not in page and "XYZ" not in page
