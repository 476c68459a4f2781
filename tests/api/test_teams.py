"""Teams through the API: admins create, rename, delete them and set members and quotas; every
role reads a team's quota next to its usage; deployments carry their team, filter by it, and a
placement past the quota is a 422 ``quota.exceeded`` that the drag preview shows first."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from fleet.allocations.models import Deployment
from fleet.core.models import DEFAULT_TEAM_SLUG, Operation, Team, TeamMembership
from fleet.core.teams import QUOTA_KEYS
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.conftest import _token_client
from tests.factories import GpuFactory, HostFactory
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db


def new_team(client, name="search", **extra):
    response = client.post("/api/v1/teams/", {"name": name, **extra}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def member(team_id, role):
    user = get_user_model().objects.create_user(f"{role}-of-{team_id}", password="x-pass-word-1")
    TeamMembership.objects.create(team_id=team_id, user=user, role=role)
    return user


def whole_gpus(n):
    host = HostFactory()
    gpus = [GpuFactory(host=host) for _ in range(n)]
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    return gpus


def test_admins_create_rename_and_delete_a_team(admin_client):
    team = new_team(admin_client, "Search Ranking")
    assert team["slug"] == "search-ranking"
    assert {k: team["quota"][k] for k in QUOTA_KEYS} == {
        "gpus": None,
        "mig_compute_slices": None,
        "mps_memory_mib": None,
        "mig_profiles": {},
    }
    assert team["usage"] == {
        "gpus": 0,
        "mig_compute_slices": 0,
        "mps_memory_mib": 0,
        "mig_profiles": {},
    }
    renamed = admin_client.patch(f"/api/v1/teams/{team['id']}/", {"name": "Ranking"}, format="json")
    assert renamed.json()["name"] == "Ranking"
    assert admin_client.delete(f"/api/v1/teams/{team['id']}/").status_code == 204
    assert not Team.objects.filter(pk=team["id"]).exists()
    assert Operation.objects.filter(kind="team").count() == 3


def test_team_names_are_unique(admin_client):
    new_team(admin_client, "search")
    assert_error(
        admin_client.post("/api/v1/teams/", {"name": "search"}, format="json"),
        409,
        "team.name_taken",
    )


def test_a_team_owning_deployments_and_the_default_team_stay(admin_client, operator_client):
    team = new_team(admin_client)
    created = operator_client.post(
        "/api/v1/deployments/",
        {"name": "x", "kind": "gpu", "gpu_count": 1, "team": team["slug"]},
        format="json",
    )
    assert created.json()["team"] == team["id"]
    assert_error(admin_client.delete(f"/api/v1/teams/{team['id']}/"), 409, "team.not_empty")
    default = Team.objects.get(slug=DEFAULT_TEAM_SLUG)
    assert_error(admin_client.delete(f"/api/v1/teams/{default.pk}/"), 409, "team.default")


def test_members_are_set_exactly(admin_client):
    team = new_team(admin_client)
    users = [get_user_model().objects.create_user(f"u{i}") for i in range(3)]
    body = {"members": [{"user": users[0].pk, "role": "operator"}, {"user": users[1].pk}]}
    out = admin_client.put(f"/api/v1/teams/{team['id']}/members", body, format="json").json()
    assert [(m["username"], m["role"]) for m in out["members"]] == [
        ("u0", "operator"),
        ("u1", "viewer"),
    ]
    body = {"members": [{"user": users[2].pk, "role": "viewer"}]}
    out = admin_client.put(f"/api/v1/teams/{team['id']}/members", body, format="json").json()
    assert [m["username"] for m in out["members"]] == ["u2"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"members": [{"user": 999999, "role": "viewer"}]}, "user.not_found"),
        ({"members": [{"user": "x", "role": "viewer"}]}, "team.members_invalid"),
        ({"members": [{"user": 1, "role": "owner"}]}, "team.members_invalid"),
        ({"members": "all"}, "team.members_invalid"),
    ],
)
def test_bad_members_are_refused_and_change_nothing(admin_client, body, code):
    team = new_team(admin_client)
    before = TeamMembership.objects.count()
    response = admin_client.put(f"/api/v1/teams/{team['id']}/members", body, format="json")
    assert response.status_code in (400, 404)
    assert_error(response, response.status_code, code)
    assert TeamMembership.objects.count() == before


def test_a_quota_is_set_limit_by_limit_and_read_next_to_the_usage(admin_client, viewer_client):
    team = new_team(admin_client)
    url = f"/api/v1/teams/{team['id']}/quota"
    admin_client.put(url, {"gpus": 4, "mig_profiles": {"mig-1g.10gb": 8}}, format="json")
    out = admin_client.put(url, {"mps_memory_mib": 65536}, format="json").json()
    assert {k: out["quota"][k] for k in QUOTA_KEYS} == {
        "gpus": 4,
        "mig_compute_slices": None,
        "mps_memory_mib": 65536,
        "mig_profiles": {"1g.10gb": 8},
    }
    lifted = admin_client.put(url, {"gpus": None}, format="json").json()
    assert lifted["quota"]["gpus"] is None
    read = viewer_client.get(f"/api/v1/teams/{team['id']}/").json()
    assert read["quota"]["mps_memory_mib"] == 65536 and read["usage"]["gpus"] == 0


def test_a_quota_change_runs_the_queue_and_the_reclaim_sweep_at_once(
    admin_client, broker, django_capture_on_commit_callbacks
):
    from fleet.core.jobs import PLACE_QUEUE, RECLAIM

    team = new_team(admin_client)
    url = f"/api/v1/teams/{team['id']}/quota"
    with django_capture_on_commit_callbacks(execute=True):
        assert admin_client.put(url, {"gpus": -1}, format="json").status_code == 400
    assert broker == []  # refused: nothing changed, nothing to run
    with django_capture_on_commit_callbacks(execute=True):
        assert admin_client.put(url, {"gpus": 2}, format="json").status_code == 200
    # What waits may now be let in (placed) or entitled (reclaimed for): neither waits a beat.
    assert sorted(broker) == sorted([PLACE_QUEUE, RECLAIM])


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"gpus": -1}, "quota.invalid"),
        ({"gpus": "four"}, "quota.invalid"),
        ({"gpus": True}, "quota.invalid"),
        ({"mig_profiles": {"1g.10gb": -2}}, "quota.invalid"),
        ({"mig_profiles": [1]}, "quota.invalid"),
        ({"cpus": 4}, "quota.field_unknown"),
    ],
)
def test_a_bad_quota_is_refused_and_changes_nothing(admin_client, body, code):
    team = new_team(admin_client)
    assert_error(
        admin_client.put(f"/api/v1/teams/{team['id']}/quota", body, format="json"), 400, code
    )
    assert not Team.objects.get(pk=team["id"]).has_quota


def test_placing_past_the_quota_is_a_422_that_the_preview_shows_first(admin_client):
    team = new_team(admin_client)
    gpus = whole_gpus(2)
    admin_client.put(f"/api/v1/teams/{team['id']}/quota", {"gpus": 1}, format="json")
    d = admin_client.post(
        "/api/v1/deployments/",
        {"name": "train", "kind": "gpu", "gpu_count": 1, "replicas": 2, "team": team["id"]},
        format="json",
    ).json()
    assert admin_client.get(f"/api/v1/deployments/{d['id']}/targets").json()["quota"] == []
    placed = admin_client.post(
        f"/api/v1/deployments/{d['id']}/place", {"gpu": gpus[0].pk}, format="json"
    )
    assert placed.status_code == 202
    preview = admin_client.get(f"/api/v1/deployments/{d['id']}/targets").json()
    assert [v["details"]["limit"] for v in preview["quota"]] == ["gpus"]
    before = snapshot_rows()
    body = assert_error(
        admin_client.post(
            f"/api/v1/deployments/{d['id']}/place", {"gpu": gpus[1].pk}, format="json"
        ),
        422,
        "quota.exceeded",
    )
    assert {k: body["details"][k] for k in ("limit", "quota", "in_use", "requested")} == {
        "limit": "gpus",
        "quota": 1,
        "in_use": 1,
        "requested": 1,
    }
    assert snapshot_rows() == before
    usage = admin_client.get(f"/api/v1/teams/{team['id']}/").json()["usage"]
    assert usage["gpus"] == 1


def test_deployments_filter_by_team_id_or_slug(admin_client, operator_client):
    team = new_team(admin_client, "vision")
    for name, owner in (("a", team["slug"]), ("b", None)):
        body = {"name": name, "kind": "gpu", "gpu_count": 1}
        if owner:
            body["team"] = owner
        operator_client.post("/api/v1/deployments/", body, format="json")
    by_slug = operator_client.get("/api/v1/deployments/?team=vision").json()["results"]
    by_id = operator_client.get(f"/api/v1/deployments/?team={team['id']}").json()["results"]
    default = operator_client.get("/api/v1/deployments/?team=default").json()["results"]
    assert [d["name"] for d in by_slug] == [d["name"] for d in by_id] == ["a"]
    assert [(d["name"], d["team_slug"]) for d in default] == [("b", "default")]


def test_a_team_operator_creates_in_its_only_team_and_must_name_one_of_several(admin_client):
    one, two = new_team(admin_client, "one"), new_team(admin_client, "two")
    user = member(one["id"], "operator")
    client = _token_client(user)
    body = {"name": "mine", "kind": "gpu", "gpu_count": 1}
    assert client.post("/api/v1/deployments/", body, format="json").json()["team"] == one["id"]
    TeamMembership.objects.create(team_id=two["id"], user=user, role="operator")
    client = _token_client(get_user_model().objects.get(pk=user.pk))
    body["name"] = "which"
    assert_error(client.post("/api/v1/deployments/", body, format="json"), 400, "team.required")
    body["team"] = "two"
    assert client.post("/api/v1/deployments/", body, format="json").json()["team"] == two["id"]


def test_a_fleet_operators_deployment_joins_the_default_team(operator_client):
    out = operator_client.post(
        "/api/v1/deployments/", {"name": "x", "kind": "gpu", "gpu_count": 1}, format="json"
    ).json()
    assert out["team_slug"] == "default"
    assert Deployment.objects.get(pk=out["id"]).team.slug == "default"


def test_a_missing_team_is_a_404(operator_client):
    body = {"name": "x", "kind": "gpu", "gpu_count": 1, "team": "nope"}
    assert_error(
        operator_client.post("/api/v1/deployments/", body, format="json"), 400, "team.not_found"
    )


def test_a_team_member_sees_the_fleet_as_a_member(admin_client):
    team = new_team(admin_client)
    client = _token_client(member(team["id"], "viewer"))
    assert client.get("/api/v1/me").json()["role"] == "member"
    assert client.get("/api/v1/gpus/").status_code == 200
    assert_error(client.post(f"/api/v1/gpus/{GpuFactory().pk}/cordon"), 403, "auth.forbidden")


def test_a_deployment_is_handed_to_another_team_by_someone_who_operates_both(
    admin_client, operator_client
):
    search, ads = new_team(admin_client, "search"), new_team(admin_client, "ads")
    deployment = Deployment.objects.create(
        name="ranker", kind="mps", memory_mib=1024, team_id=search["id"]
    )
    url = f"/api/v1/deployments/{deployment.pk}/"
    only_search = _token_client(member(search["id"], "operator"))
    before = snapshot_rows()
    assert_error(only_search.patch(url, {"team": "ads"}, format="json"), 403)
    assert_error(admin_client.patch(url, {"team": "nope"}, format="json"), 400, "team.not_found")
    assert_error(admin_client.patch(url, {"team": ["ads"]}, format="json"), 400, "team.not_found")
    assert_error(
        admin_client.patch(url, {"team": "ads", "replicas": 2}, format="json"),
        400,
        "deployment.one_change",
    )
    assert snapshot_rows() == before
    both = member(ads["id"], "operator")
    TeamMembership.objects.create(team_id=search["id"], user=both, role="operator")
    handed = _token_client(both).patch(url, {"team": ads["id"]}, format="json")
    assert handed.status_code == 200, handed.json()
    assert handed.json()["team"] == ads["id"] and handed.json()["team_slug"] == "ads"
    back = operator_client.patch(url, {"team": "search"}, format="json")  # a fleet operator
    assert back.status_code == 200 and back.json()["team_slug"] == "search"
    assert Operation.objects.filter(kind="team", deployment=deployment).count() == 2
