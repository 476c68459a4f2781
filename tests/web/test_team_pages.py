"""The dashboard with teams: a smaller permission matrix over the pages and forms (fleet role x
team role x own/other team: which pages open, which controls a user gets, which forms it may
post), the team pages with each limit next to its usage, and the team shown and filtered on the
deployment pages and the tray."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.models import Team, TeamMembership
from fleet.core.roles import Role
from fleet.core.services import user_create
from fleet.core.teams import team_create, team_quota_set
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory

pytestmark = pytest.mark.django_db

FLEET_ROLES = ["none", "viewer", "operator", "admin"]
TEAM_ROLES = ["none", "viewer", "operator"]
WHOSE = ["own", "other"]
MATRIX = list(itertools.product(FLEET_ROLES, TEAM_ROLES, WHOSE))


@pytest.fixture
def world() -> dict[str, Any]:
    alpha, beta = team_create(name="alpha"), team_create(name="beta")
    host = HostFactory()
    gpus = [GpuFactory(host=host) for _ in range(2)]
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    mine = deployment_create(
        name="alpha-train",
        request=DeploymentRequest(kind="gpu", gpu_count=1),
        replicas=2,
        team_id=alpha.pk,
    )
    deployment_place(deployment_id=mine.pk, gpu_id=gpus[0].pk)
    default = deployment_create(
        name="shared", request=DeploymentRequest(kind="gpu", gpu_count=1), replicas=1
    )
    return {"alpha": alpha, "beta": beta, "d": mine, "default": default}


def browser(fleet: str, team: str, whose: str, world: dict[str, Any]) -> Client:
    if fleet == "none":
        user = get_user_model().objects.create_user("someone", password="s3cret-pass-word")
    else:
        user = user_create(
            username="someone", password="s3cret-pass-word", role=Role[fleet.upper()]
        )
    if team != "none":
        TeamMembership.objects.create(
            team=world["alpha"] if whose == "own" else world["beta"], user=user, role=team
        )
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    ("fleet", "team", "whose"), MATRIX, ids=["-".join(case) for case in MATRIX]
)
def test_the_dashboard_permission_matrix(world, fleet, team, whose):
    client = browser(fleet, team, whose, world)
    d, alpha = world["d"], world["alpha"]
    sees = fleet != "none" or team != "none"
    acts = fleet in ("operator", "admin") or (team == "operator" and whose == "own")
    admin = fleet == "admin"
    pages = ["/", "/deployments/", f"/deployments/{d.pk}/", "/teams/", f"/teams/{alpha.pk}/"]
    pages += ["/ui/tray", "/ui/deployments", f"/ui/deployments/{d.pk}/panel"]
    for url in pages:
        assert client.get(url).status_code == (200 if sees else 403), url
    if not sees:
        return
    detail = client.get(f"/deployments/{d.pk}/").content.decode()
    assert ('id="scale-form"' in detail) is acts
    # What it runs and its replica metrics: its own team's members and fleet viewers and up.
    sees_spec = fleet != "none" or whose == "own"
    assert ('class="dep-workload-json"' in detail) is sees_spec
    assert ('id="workload-hidden"' in detail) is not sees_spec
    assert ('id="replica-metrics"' in detail) is sees_spec
    metrics = client.get(f"/ui/deployments/{d.pk}/metrics")
    assert metrics.status_code == (200 if sees_spec else 403)
    assert ('id="defrag-show"' in detail) is (fleet in ("operator", "admin"))
    tray = client.get("/ui/tray").content.decode()
    card = tray[tray.index(f'id="dep-{d.pk}"') :].split("</article>")[0]
    assert ('draggable="true"' in card) is acts
    assert ('data-action="place"' in card) is acts
    fleet_page = client.get("/").content.decode()
    allocation = Allocation.objects.get(deployment=d)
    replica = fleet_page[fleet_page.index(f'data-allocation="{allocation.pk}"') :].split(">")[0]
    assert ('draggable="true"' in replica) is acts  # a drag moves it
    team_page = client.get(f"/teams/{alpha.pk}/").content.decode()
    assert ('id="quota-form"' in team_page) is admin
    assert ('id="members-form"' in team_page) is admin
    posted = client.post(f"/teams/{alpha.pk}/", {"form": "quota", "gpus": "3"})
    assert posted.status_code == (302 if admin else 403)
    assert Team.objects.get(pk=alpha.pk).quota_gpus == (3 if admin else None)
    created = client.post("/teams/", {"name": "gamma"})
    assert created.status_code == (302 if admin else 403)
    assert Team.objects.filter(name="gamma").exists() is admin


def test_the_matrix_size():
    assert len(MATRIX) == 24


def test_the_team_page_shows_each_limit_next_to_its_usage(world, admin_user):
    alpha = world["alpha"]
    team_quota_set(team_id=alpha.pk, quota={"gpus": 4, "mig_profiles": {"1g.10gb": 8}})
    client = Client()
    client.force_login(admin_user)
    page = client.get(f"/teams/{alpha.pk}/").content.decode()
    row = page[page.index('data-limit="gpus"') :].split("</tr>")[0]
    assert '<td class="mono" data-in-use>1</td>' in row and ">4</td>" in row
    assert 'data-limit="mig_profiles.1g.10gb"' in page
    assert "alpha-train" in page
    listing = client.get("/teams/").content.decode()
    assert "Whole GPUs: 1 / 4" in listing


def test_admins_set_members_and_quota_through_the_team_page(world, admin_user):
    alpha = world["alpha"]
    get_user_model().objects.create_user("alice")
    client = Client()
    client.force_login(admin_user)
    response = client.post(
        f"/teams/{alpha.pk}/", {"form": "members", "members": "alice operator\n"}
    )
    assert response.status_code == 302
    assert TeamMembership.objects.get(team=alpha).role == "operator"
    response = client.post(
        f"/teams/{alpha.pk}/",
        {"form": "quota", "gpus": "", "mps_memory_mib": "65536", "mig_profiles": "1g.10gb=8"},
    )
    alpha.refresh_from_db()
    assert (alpha.quota_gpus, alpha.quota_mps_memory_mib, alpha.quota_mig_profiles) == (
        None,
        65536,
        {"1g.10gb": 8},
    )
    refused = client.post(f"/teams/{alpha.pk}/", {"form": "quota", "gpus": "-3"})
    assert refused.status_code == 400
    assert b"quota.invalid" in refused.content


def test_deployment_pages_and_the_tray_show_the_team_and_filter_by_it(world, operator_web):
    listing = operator_web.get("/deployments/?team=alpha").content.decode()
    assert "alpha-train" in listing and "shared" not in listing
    assert '<span class="chip team">alpha</span>' in listing
    rows = operator_web.get("/ui/deployments?team=default").content.decode()
    assert "shared" in rows and "alpha-train" not in rows
    tray = operator_web.get("/?team=alpha").content.decode()
    assert 'data-team="alpha"' in tray and "alpha-train" in tray
    assert 'id="dep-{}"'.format(world["default"].pk) not in tray
    detail = operator_web.get(f"/deployments/{world['d'].pk}/").content.decode()
    assert "team alpha" in detail


def test_the_tray_says_when_the_teams_quota_refuses_the_next_replica(world, operator_web):
    team_quota_set(team_id=world["alpha"].pk, quota={"gpus": 1})
    tray = operator_web.get("/ui/tray").content.decode()
    card = tray[tray.index(f'id="dep-{world["d"].pk}"') :].split("</article>")[0]
    assert "quota" in card and "fit-reason" in card
    assert "Place all" not in card


def test_leaving_the_last_team_closes_the_live_sockets_of_a_user_without_a_fleet_role(
    world, monkeypatch, django_capture_on_commit_callbacks
):
    from fleet.core import signals

    closed = []
    monkeypatch.setattr(signals, "publish_user_revoked", lambda user_id, code: closed.append(code))
    user = get_user_model().objects.create_user("member")
    membership = TeamMembership.objects.create(team=world["alpha"], user=user, role="viewer")
    with django_capture_on_commit_callbacks(execute=True):
        membership.delete()
    assert closed == [signals.CLOSE_NO_ROLE]
