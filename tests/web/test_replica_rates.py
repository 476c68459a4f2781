"""The fleet view's replica tooltips carry each replica's request rate (issue 23): ``/ui/replica-
rates`` answers what the gateways measured, ``null`` while they measure, nothing for replicas
no gateway measured, and another team's member is not told (a rate is a replica metric)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from fleet.core.models import Team, TeamMembership
from fleet.endpoints.traffic import traffic_record
from tests.allocations.test_workloads import mig_gpu as mig_gpu  # the fixture
from tests.endpoints.test_traffic import _endpoint, sample

pytestmark = pytest.mark.django_db


def member_of(team: Team) -> Client:
    user = get_user_model().objects.create_user(f"member-of-{team.slug}", password="x-pass-1")
    TeamMembership.objects.create(team=team, user=user, role="viewer")
    client = Client()
    client.force_login(user)
    return client


def test_the_rates_the_gateways_measured_and_only_for_those_who_may_see_them(
    mig_gpu, client, viewer
):
    deployment_id, slot, copy = _endpoint(mig_gpu)
    client.force_login(viewer)
    assert client.get("/ui/replica-rates").json() == {"rates": {}}  # nobody measures it
    traffic_record("gw", [sample(slot, copy, 3.25), sample(slot, 0, 3.25)])
    assert client.get("/ui/replica-rates").json() == {"rates": {str(copy): 3.25}}
    traffic_record("gw", [sample(slot, copy, None)])
    assert client.get("/ui/replica-rates").json() == {"rates": {str(copy): None}}
    own = Team.objects.get(deployments__pk=deployment_id)
    other = Team.objects.create(name="Other", slug="other")
    assert member_of(own).get("/ui/replica-rates").json()["rates"] == {str(copy): None}
    assert member_of(other).get("/ui/replica-rates").json() == {"rates": {}}
