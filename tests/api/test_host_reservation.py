"""``PUT /api/v1/hosts/{id}/reservation``: fleet admins reserve a host for teams (ids or slugs),
``[]`` lifts it; operators and viewers are refused; an unknown team or host changes nothing; each
change is a ``reserve_host`` operation and the host shows ``reserved_for``."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from fleet.core.models import Operation, OperationKind, TeamMembership
from fleet.core.services import api_token_create
from fleet.core.teams import team_create
from fleet.inventory.models import Host
from tests.factories import HostFactory
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def host():
    return HostFactory(name="gpu-a")


@pytest.fixture
def teams():
    return team_create(name="search"), team_create(name="ads")


def _url(host) -> str:
    return f"/api/v1/hosts/{host.pk}/reservation"


def _reserved(host) -> list[str]:
    return sorted(Host.objects.get(pk=host.pk).reserved_for.values_list("slug", flat=True))


def test_an_admin_reserves_a_host_for_teams_by_slug_or_id_and_lifts_it(
    admin_client, host, teams, django_capture_on_commit_callbacks
):
    search, ads = teams
    with django_capture_on_commit_callbacks() as published:
        response = admin_client.put(_url(host), {"teams": ["search", ads.pk]}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["reserved_for"] == ["ads", "search"]
    assert _reserved(host) == ["ads", "search"]
    assert published  # the change event for browsers, on commit
    assert admin_client.get(f"/api/v1/hosts/{host.pk}/").json()["reserved_for"] == [
        "ads",
        "search",
    ]

    operation = Operation.objects.get(kind=OperationKind.RESERVE_HOST)
    assert operation.host_id == host.pk and operation.status == "succeeded"
    assert operation.summary == "Reserved gpu-a for ads, search"
    assert operation.payload == {
        "before": [],
        "after": ["ads", "search"],
        "teams": sorted([search.pk, ads.pk]),
    }
    assert operation.requested_by is not None

    lifted = admin_client.put(_url(host), {"teams": []}, format="json")
    assert lifted.status_code == 200 and lifted.json()["reserved_for"] == []
    assert _reserved(host) == []
    last = Operation.objects.filter(kind=OperationKind.RESERVE_HOST).latest("pk")
    assert last.summary == "Reservation of gpu-a lifted"


def test_the_same_reservation_again_records_nothing(admin_client, host, teams):
    for _ in range(2):
        response = admin_client.put(_url(host), {"teams": ["search", "search"]}, format="json")
        assert response.status_code == 200
    assert Operation.objects.filter(kind=OperationKind.RESERVE_HOST).count() == 1


def test_the_host_list_shows_each_hosts_reservation(viewer_client, admin_client, host, teams):
    HostFactory(name="gpu-b")
    admin_client.put(_url(host), {"teams": ["search"]}, format="json")
    rows = {
        h["name"]: h["reserved_for"] for h in viewer_client.get("/api/v1/hosts/").json()["results"]
    }
    assert rows == {"gpu-a": ["search"], "gpu-b": []}


@pytest.mark.parametrize("client", ["operator_client", "viewer_client"])
def test_only_admins_reserve_a_host(request, client, host, teams):
    caller = request.getfixturevalue(client)
    before = snapshot_rows()
    response = caller.put(_url(host), {"teams": ["search"]}, format="json")
    assert_error(response, 403)
    assert snapshot_rows() == before
    assert _reserved(host) == []


def test_a_team_operator_cannot_reserve_a_host(host, teams):
    search, _ = teams
    user = get_user_model().objects.create_user("lead", password="s3cret-pass-word")
    TeamMembership.objects.create(team=search, user=user, role="operator")
    _, secret = api_token_create(user=user, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert_error(client.put(_url(host), {"teams": ["search"]}, format="json"), 403)
    assert _reserved(host) == []


@pytest.mark.parametrize(
    "teams_named", [["search", "nope"], [999999], ["search", "12345"]], ids=str
)
def test_an_unknown_team_is_a_400_that_names_it_and_changes_nothing(
    admin_client, host, teams, teams_named
):
    before = snapshot_rows()
    body = assert_error(
        admin_client.put(_url(host), {"teams": teams_named}, format="json"), 400, "team.not_found"
    )
    assert body["details"]["teams"] == [str(t) for t in teams_named if t != "search"]
    assert snapshot_rows() == before


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"teams": "search"},
        {"teams": [True]},
        {"teams": [{"id": 1}]},
        {"teams": [""]},
        {"teams": ["sea\x00rch"]},
        {"teams": [0]},
    ],
    ids=str,
)
def test_a_malformed_body_is_a_400_that_changes_nothing(admin_client, host, teams, body):
    before = snapshot_rows()
    assert_error(admin_client.put(_url(host), body, format="json"), 400)
    assert snapshot_rows() == before


def test_too_many_teams_are_refused_before_any_lookup(admin_client, host):
    response = admin_client.put(_url(host), {"teams": list(range(1, 66))}, format="json")
    assert_error(response, 400)


def test_an_unknown_host_is_a_404(admin_client, teams):
    assert_error(
        admin_client.put("/api/v1/hosts/999999/reservation", {"teams": []}, format="json"),
        404,
        "host.not_found",
    )
