"""A team's quota is its deserved share (the four kinds, as before), plus an optional ``limit``
(the most it may hold, borrowing included) and an ``over_quota_weight``: ``PUT
/teams/{id}/quota`` keeps its shape, an old body still sets the deserved share."""

from __future__ import annotations

import pytest

from fleet.core.models import Operation, Team
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture
def team(admin_client):
    response = admin_client.post("/api/v1/teams/", {"name": "search"}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def put_quota(client, team, body):
    return client.put(f"/api/v1/teams/{team['id']}/quota", body, format="json")


def test_an_old_body_sets_the_deserved_share_and_leaves_no_limit(admin_client, team):
    out = put_quota(admin_client, team, {"gpus": 4}).json()["quota"]
    assert out["gpus"] == 4
    assert out["limit"] == {
        "gpus": None,
        "mig_compute_slices": None,
        "mps_memory_mib": None,
        "mig_profiles": {},
    }
    assert out["over_quota_weight"] == 1


def test_the_limit_and_weight_are_set_beside_the_deserved_share_and_read_back(
    admin_client, viewer_client, team
):
    body = {
        "gpus": 2,
        "mig_profiles": {"1g.10gb": 4},
        "limit": {"gpus": 6, "mig_profiles": {"mig-1g.10gb": 10}, "mps_memory_mib": 8192},
        "over_quota_weight": 3,
    }
    response = put_quota(admin_client, team, body)
    assert response.status_code == 200, response.json()
    read = viewer_client.get(f"/api/v1/teams/{team['id']}/").json()["quota"]
    assert (read["gpus"], read["mig_profiles"]) == (2, {"1g.10gb": 4})
    assert read["limit"] == {
        "gpus": 6,
        "mig_compute_slices": None,
        "mps_memory_mib": 8192,
        "mig_profiles": {"1g.10gb": 10},
    }
    assert read["over_quota_weight"] == 3
    recorded = Operation.objects.filter(kind="set_quota").latest("pk")
    assert recorded.payload["quota"]["limit"]["gpus"] == 6


def test_a_limit_not_given_stays_and_null_lifts_them_all(admin_client, team):
    put_quota(admin_client, team, {"limit": {"gpus": 6, "mig_compute_slices": 7}})
    kept = put_quota(admin_client, team, {"limit": {"gpus": 8}}).json()["quota"]["limit"]
    assert (kept["gpus"], kept["mig_compute_slices"]) == (8, 7)
    lifted = put_quota(admin_client, team, {"limit": None}).json()["quota"]["limit"]
    assert (lifted["gpus"], lifted["mig_compute_slices"]) == (None, None)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"gpus": 4, "limit": {"gpus": 3}}, "quota.invalid"),
        (
            {"mig_profiles": {"1g.10gb": 4}, "limit": {"mig_profiles": {"1g.10gb": 2}}},
            "quota.invalid",
        ),
        ({"limit": [4]}, "quota.invalid"),
        ({"limit": {"gpus": -1}}, "quota.invalid"),
        ({"limit": {"cpus": 4}}, "quota.field_unknown"),
        ({"over_quota_weight": 0}, "quota.invalid"),
        ({"over_quota_weight": 1001}, "quota.invalid"),
        ({"over_quota_weight": "2"}, "quota.invalid"),
        ({"deserved_gpus": 2}, "quota.field_unknown"),
    ],
)
def test_a_bad_limit_or_weight_is_refused_and_changes_nothing(admin_client, team, body, code):
    before = Team.objects.values().get(pk=team["id"])
    assert_error(put_quota(admin_client, team, body), 400, code)
    assert Team.objects.values().get(pk=team["id"]) == before


def test_only_admins_set_the_limit(operator_client, team):
    assert_error(put_quota(operator_client, team, {"limit": {"gpus": 9}}), 403)
    assert Team.objects.get(pk=team["id"]).limit_gpus is None
