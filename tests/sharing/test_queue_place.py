"""Placing from the queue (beat's ``fleet.place_queue``): waiting replicas of auto-placed
deployments are placed as capacity frees, in the order the queue serves them, through the same
quota, borrowing and engine checks as any place; operators' deployments wait for them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.services import DeploymentRequest, deployment_create
from fleet.core.teams import team_create, team_quota_set
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from fleet.sharing.placing import queue_place
from tests.factories import GpuFactory, HostFactory

pytestmark = pytest.mark.django_db

WHOLE = DeploymentRequest(kind="gpu", gpu_count=1)


def gpus(n):
    host = HostFactory()
    found = [GpuFactory(host=host) for _ in range(n)]
    for gpu in found:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    return found


def auto(name, team, minutes_ago=0, replicas=1):
    d = deployment_create(
        name=name, request=WHOLE, replicas=replicas, team_id=team.pk, auto_place=True
    )
    Deployment.objects.filter(pk=d.pk).update(
        created_at=d.created_at - timedelta(minutes=minutes_ago)
    )
    return d


def placed(deployment):
    return Allocation.objects.placed().filter(deployment=deployment).count()


def test_waiting_replicas_are_placed_in_queue_order_as_capacity_frees():
    (gpu,) = gpus(1)
    ads, search = team_create(name="ads"), team_create(name="search")
    later = auto("later", ads, minutes_ago=1)
    first = auto("first", search, minutes_ago=5)  # waited longest: served first
    assert len(queue_place()) == 1
    assert (placed(first), placed(later)) == (1, 0)
    assert queue_place() == []  # the fleet is full: nothing placed, nothing forced
    (more,) = gpus(1)  # capacity comes: a GPU joins
    assert len(queue_place()) == 1 and placed(later) == 1
    assert Allocation.objects.get(deployment=later).gpu_id == more.pk != gpu.pk


def test_an_operators_deployment_waits_for_the_operator():
    gpus(1)
    team = team_create(name="ads")
    manual = deployment_create(name="manual", request=WHOLE, replicas=1, team_id=team.pk)
    assert queue_place() == [] and placed(manual) == 0


def test_a_team_its_quota_refuses_does_not_hold_up_the_others():
    gpus(2)
    capped, other = team_create(name="capped"), team_create(name="other")
    team_quota_set(team_id=capped.pk, quota={"gpus": 0})
    for n in range(3):
        auto(f"capped-{n}", capped, minutes_ago=10 + n)
    served = auto("served", other, minutes_ago=1)
    assert len(queue_place()) == 1 and placed(served) == 1
    assert Allocation.objects.filter(deployment__team=capped).count() == 0


def test_one_run_makes_a_bounded_number_of_attempts(monkeypatch):
    gpus(1)
    team = team_create(name="ads")
    big = DeploymentRequest(kind="gpu", gpu_count=2)  # fits nowhere: one GPU per host
    for n in range(5):
        d = deployment_create(
            name=f"big-{n}", request=big, replicas=1, team_id=team.pk, auto_place=True
        )
        assert d.auto_place
    small = auto("small", team)
    calls = []
    import fleet.sharing.placing as placing

    real = placing.deployment_autoplace

    def counted(**kwargs):
        calls.append(kwargs["deployment_id"])
        return real(**kwargs)

    monkeypatch.setattr(placing, "deployment_autoplace", counted)
    assert len(queue_place()) == 1 and placed(small) == 1
    # The first 2-GPU replica that fits nowhere stops the attempts at the same request.
    assert len(calls) == 2


def test_a_replica_that_fits_nowhere_kicks_the_reclaim_sweep(
    broker, django_capture_on_commit_callbacks
):
    from fleet.core.jobs import RECLAIM

    gpus(1)
    team = team_create(name="ads")
    auto("one", team, minutes_ago=2)
    with django_capture_on_commit_callbacks(execute=True):
        assert len(queue_place()) == 1  # it fitted: no reclaim asked for
    assert RECLAIM not in broker
    auto("two", team, minutes_ago=1)
    with django_capture_on_commit_callbacks(execute=True):
        assert queue_place() == []  # the fleet is full: the sweep decides, at once
    assert RECLAIM in broker


def test_a_refused_replica_stops_only_its_teams_replicas_asking_for_as_much(monkeypatch):
    import fleet.sharing.placing as placing

    gpus(2)
    team = team_create(name="ads")
    team_quota_set(team_id=team.pk, quota={"gpus": 1})
    two = DeploymentRequest(kind="gpu", gpu_count=2)
    big = deployment_create(name="big", request=two, replicas=1, team_id=team.pk, auto_place=True)
    Deployment.objects.filter(pk=big.pk).update(created_at=big.created_at - timedelta(minutes=9))
    also_big = deployment_create(
        name="also-big", request=two, replicas=1, team_id=team.pk, auto_place=True
    )
    Deployment.objects.filter(pk=also_big.pk).update(
        created_at=also_big.created_at - timedelta(minutes=8)
    )
    small = auto("small", team, minutes_ago=1)
    tried = []
    real = placing.deployment_autoplace
    monkeypatch.setattr(
        placing,
        "deployment_autoplace",
        lambda deployment_id, limit: (
            tried.append(deployment_id) or real(deployment_id=deployment_id, limit=limit)
        ),
    )
    # big (2 GPUs, first in the queue) passes the team's quota of 1: also-big, asking as much,
    # is not tried in this run; small, asking less, still is, and fits.
    assert len(queue_place()) == 1
    assert tried == [big.pk, small.pk]
    assert (placed(big), placed(also_big), placed(small)) == (0, 0, 1)
