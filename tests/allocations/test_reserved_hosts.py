"""A host reserved for some teams (``placement.host_reserved``) takes only their deployments'
replicas, on every path that chooses a slice: the drop, auto-placement, the drag preview, a
move; replicas already there when it becomes reserved stay."""

from __future__ import annotations

import pytest

from fleet.allocations.autoplace import deployment_create_placed
from fleet.allocations.models import Allocation
from fleet.allocations.moves import allocation_move
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import RuleViolation
from fleet.core.teams import team_create
from fleet.inventory.reservations import host_set_reservation
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory
from tests.helpers import snapshot_rows

pytestmark = pytest.mark.django_db

MPS = DeploymentRequest(kind="mps", memory_mib=4096)


@pytest.fixture
def teams():
    return team_create(name="search"), team_create(name="ads")


def mps_gpu(name: str):
    gpu = GpuFactory(host=HostFactory(name=name), product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    return gpu


@pytest.fixture
def reserved(teams):
    """``gpu-a`` reserved for ``search``."""
    gpu = mps_gpu("gpu-a")
    host_set_reservation(host_id=gpu.host_id, teams=["search"])
    return gpu


def test_a_replica_of_another_team_is_refused_with_the_rule_code_and_nothing_written(
    teams, reserved
):
    _, ads = teams
    d = deployment_create(name="ranker", request=MPS, replicas=1, team_id=ads.pk)
    before = snapshot_rows()
    with pytest.raises(RuleViolation) as refused:
        deployment_place(deployment_id=d.pk, gpu_id=reserved.pk)
    assert refused.value.code == "placement.host_reserved"
    assert refused.value.status_code == 422
    assert "gpu-a is reserved for team(s) search" in refused.value.message
    assert snapshot_rows() == before


def test_a_replica_of_the_team_it_is_reserved_for_is_placed(teams, reserved):
    search, _ = teams
    d = deployment_create(name="index", request=MPS, replicas=1, team_id=search.pk)
    deployment_place(deployment_id=d.pk, gpu_id=reserved.pk)
    assert Allocation.objects.get(deployment=d).gpu_id == reserved.pk


def test_auto_placement_skips_the_reserved_host(teams, reserved):
    search, ads = teams
    free = mps_gpu("gpu-z")  # last in the engine's tie order: chosen only if gpu-a is not
    other = deployment_create_placed(name="ranker", request=MPS, replicas=2, team_id=ads.pk)
    assert set(Allocation.objects.filter(deployment=other).values_list("gpu_id", flat=True)) == {
        free.pk
    }
    mine = deployment_create_placed(name="index", request=MPS, replicas=1, team_id=search.pk)
    assert Allocation.objects.get(deployment=mine).gpu_id == reserved.pk


def test_auto_placement_with_only_reserved_hosts_says_why(teams, reserved):
    _, ads = teams
    with pytest.raises(RuleViolation) as refused:
        deployment_create_placed(name="ranker", request=MPS, replicas=1, team_id=ads.pk)
    codes = {v["code"] for v in refused.value.details["violations"]}
    assert "placement.host_reserved" in codes


def test_replicas_already_on_a_host_stay_when_it_is_reserved_for_another_team(teams):
    search, ads = teams
    gpu = mps_gpu("gpu-a")
    d = deployment_create(name="ranker", request=MPS, replicas=2, team_id=ads.pk)
    deployment_place(deployment_id=d.pk, gpu_id=gpu.pk)
    placed = list(Allocation.objects.placed().filter(deployment=d).values_list("pk", flat=True))

    host_set_reservation(host_id=gpu.host_id, teams=[search.pk])

    assert list(Allocation.objects.placed().filter(deployment=d).values_list("pk", flat=True)) == (
        placed
    )
    with pytest.raises(RuleViolation) as refused:  # but no new one goes there
        deployment_place(deployment_id=d.pk, gpu_id=gpu.pk)
    assert refused.value.code == "placement.host_reserved"


def test_a_move_onto_a_host_reserved_for_another_team_is_refused(teams, reserved):
    _, ads = teams
    elsewhere = mps_gpu("gpu-b")
    d = deployment_create(name="ranker", request=MPS, replicas=1, team_id=ads.pk)
    deployment_place(deployment_id=d.pk, gpu_id=elsewhere.pk)
    before = snapshot_rows()
    with pytest.raises(RuleViolation) as refused:
        allocation_move(allocation_id=Allocation.objects.get(deployment=d).pk, gpu_id=reserved.pk)
    assert refused.value.code == "placement.host_reserved"
    assert snapshot_rows() == before


def test_the_drag_preview_lists_the_reserved_host_with_its_reason(teams, reserved, viewer_client):
    _, ads = teams
    free = mps_gpu("gpu-b")
    d = deployment_create(name="ranker", request=MPS, replicas=1, team_id=ads.pk)
    body = viewer_client.get(f"/api/v1/deployments/{d.pk}/targets").json()
    assert [t["gpu"] for t in body["feasible"]] == [free.pk]
    (refusal,) = [r for r in body["infeasible"] if r["gpu"] == reserved.pk]
    assert [v["code"] for v in refusal["violations"]] == ["placement.host_reserved"]
    assert refusal["violations"][0]["details"]["reserved_for"] == ["search"]


def test_lifting_the_reservation_opens_the_host_to_every_team(teams, reserved):
    _, ads = teams
    host_set_reservation(host_id=reserved.host_id, teams=[])
    d = deployment_create(name="ranker", request=MPS, replicas=1, team_id=ads.pk)
    deployment_place(deployment_id=d.pk, gpu_id=reserved.pk)
    assert Allocation.objects.get(deployment=d).gpu_id == reserved.pk
