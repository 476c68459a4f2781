"""``GET /queue/``: every waiting replica in the order it is served (priority, then its team's
weighted share of decayed use from the usage intervals Fleet keeps, then the longest waiting),
with its position and what blocks it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from fleet.allocations.models import UsageInterval
from fleet.allocations.services import DeploymentRequest, deployment_create
from fleet.core.teams import team_create, team_quota_set
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory

pytestmark = pytest.mark.django_db

WHOLE = DeploymentRequest(kind="gpu", gpu_count=1)


@pytest.fixture
def one_free_gpu():
    gpu = GpuFactory(host=HostFactory())
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    return gpu


def used(team, gpus, days_ago):
    """The team held ``gpus`` whole GPUs for a day, ``days_ago`` days ago."""
    end = timezone.now() - timedelta(days=days_ago)
    UsageInterval.objects.create(
        allocation_id=9000 + team.pk,
        deployment_id=9000 + team.pk,
        deployment_name="gone",
        team_id=team.pk,
        team_name=team.name,
        replica=0,
        kind="gpu",
        gpu_id=1,
        gpu_memory_mib=81920,
        gpu_count=gpus,
        started_at=end - timedelta(days=1),
        ended_at=end,
    )


def waiting(team, name, priority="", replicas=1):
    d = deployment_create(name=name, request=WHOLE, replicas=replicas, team_id=team.pk)
    if priority:
        d.priority = priority
        d.save(update_fields=["priority"])
    return d


def queue_of(client):
    response = client.get("/api/v1/queue/")
    assert response.status_code == 200, response.json()
    return response.json()


def test_the_queue_serves_priority_first_then_the_team_that_used_less(viewer_client, one_free_gpu):
    heavy, light = team_create(name="heavy"), team_create(name="light")
    used(heavy, 8, days_ago=1)
    used(light, 1, days_ago=1)
    waiting(heavy, "heavy-batch", "batch")
    waiting(light, "light-batch", "batch")
    waiting(heavy, "heavy-critical", "critical")
    body = queue_of(viewer_client)
    assert body["half_life_s"] == 7 * 86400
    order = [(e["position"], e["deployment_name"], e["priority"]) for e in body["waiting"]]
    assert order == [
        (1, "heavy-critical", "critical"),
        (2, "light-batch", "batch"),
        (3, "heavy-batch", "batch"),
    ]
    shares = {e["team_name"]: e["team_share"] for e in body["waiting"]}
    assert 0 < shares["light"] < shares["heavy"]
    assert {e["reason"]["code"] for e in body["waiting"]} == {"queue.fits_now"}


def test_a_deployment_without_priority_takes_its_teams_default(viewer_client, one_free_gpu):
    team = team_create(name="search")
    team.default_priority = "production"
    team.save()
    waiting(team, "serve")
    entry = queue_of(viewer_client)["waiting"][0]
    assert (entry["priority"], entry["priority_value"]) == ("production", 500)


@override_settings(FLEET_FAIRSHARE_HALF_LIFE_S=86400.0)
def test_with_a_short_half_life_an_old_heavy_use_fades_behind_a_recent_light_one(
    viewer_client, one_free_gpu
):
    old, recent = team_create(name="old"), team_create(name="recent")
    used(old, 8, days_ago=20)
    used(recent, 1, days_ago=0)
    waiting(recent, "r")
    waiting(old, "o")
    assert [e["team_name"] for e in queue_of(viewer_client)["waiting"]] == ["old", "recent"]


def test_each_waiting_replica_says_what_blocks_it(viewer_client, one_free_gpu):
    capped = team_create(name="capped")
    team_quota_set(team_id=capped.pk, quota={"gpus": 0})
    waiting(capped, "refused")
    free = team_create(name="free")
    waiting(free, "two", replicas=2)
    entries = {
        (e["deployment_name"], e["replica"]): e["reason"]
        for e in queue_of(viewer_client)["waiting"]
    }
    assert entries[("refused", 0)]["code"] == "quota.exceeded"
    assert entries[("two", 0)]["code"] == "queue.fits_now"
    assert entries[("two", 1)]["code"] not in ("queue.fits_now", "quota.exceeded")
    assert entries[("two", 1)]["message"]


def test_the_queue_needs_a_sign_in(client):
    assert client.get("/api/v1/queue/").status_code in (401, 403)
