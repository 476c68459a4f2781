"""Handing a deployment to another team: its replicas stay put, the new team's quota must hold
them (422 otherwise, changing nothing), and chargeback splits at the change."""

from __future__ import annotations

import pytest

from fleet.allocations.accounting.usage import Window, usage_report
from fleet.allocations.models import Allocation, Deployment, UsageInterval
from fleet.allocations.ownership import deployment_set_team
from fleet.allocations.quotas import QuotaExceeded
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.models import Operation
from fleet.core.teams import team_create, team_quota_set
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.allocations.accounting.test_usage import at, clock
from tests.factories import GpuFactory
from tests.helpers import snapshot_rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def placed():
    """A deployment of two whole-GPU replicas on the default team, placed at hour 0."""
    gpus = [GpuFactory(product_key="h100-sxm5-80gb") for _ in range(2)]
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    deployment = deployment_create(
        name="ranker", request=DeploymentRequest(kind="gpu", gpu_count=1), replicas=2
    )
    with clock(at(0)):
        for gpu in gpus:
            deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)
    return deployment


def test_a_handed_over_deployment_keeps_its_replicas_and_bills_the_new_team_from_then(placed):
    search = team_create(name="search")
    before = sorted(Allocation.objects.values_list("pk", "gpu_id", "state"))
    with clock(at(2)):
        operation = deployment_set_team(deployment_id=placed.pk, team_id=search.pk)
    assert operation is not None and operation.kind == "team"
    assert Deployment.objects.get(pk=placed.pk).team_id == search.pk
    assert sorted(Allocation.objects.values_list("pk", "gpu_id", "state")) == before
    assert UsageInterval.objects.filter(ended_at__isnull=True, team_id=search.pk).count() == 2
    assert UsageInterval.objects.filter(ended_at=at(2)).count() == 2
    report = usage_report(Window(at(0), at(5), "team", now=at(5)))
    hours = {g["name"]: g["gpu_hours"] for g in report["groups"]}
    assert hours == {"default": 4.0, "search": 6.0}  # 2 replicas x 2 h, then x 3 h
    with clock(at(3)):  # the same team again: nothing to do
        assert deployment_set_team(deployment_id=placed.pk, team_id=search.pk) is None
    assert UsageInterval.objects.count() == 4


def test_the_new_teams_quota_must_hold_the_replicas_and_a_refusal_changes_nothing(placed):
    small = team_create(name="small")
    team_quota_set(team_id=small.pk, quota={"gpus": 1})
    before = snapshot_rows()
    with pytest.raises(QuotaExceeded) as refused:
        deployment_set_team(deployment_id=placed.pk, team_id=small.pk)
    assert refused.value.code == "quota.exceeded"
    assert refused.value.details["limit"] == "gpus" and refused.value.details["requested"] == 2
    assert snapshot_rows() == before
    team_quota_set(team_id=small.pk, quota={"gpus": 2})
    assert deployment_set_team(deployment_id=placed.pk, team_id=small.pk) is not None
    assert Operation.objects.filter(kind="team", deployment=placed).count() == 1
