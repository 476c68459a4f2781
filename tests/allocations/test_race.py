"""Two placements racing for the last capacity of one GPU: one wins, the GPU is never
over-committed. Needs real concurrent transactions, so it runs on PostgreSQL only."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import ServiceError
from fleet.mps import MpsPolicy
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.factories import GpuFactory
from tests.helpers import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("the race needs PostgreSQL (set FLEET_DATABASE_URL); SQLite serialises writers")


@pytest.mark.parametrize("attempt", range(5))
def test_two_mps_placements_never_overcommit_a_gpu(attempt):
    gpu = GpuFactory(product_key="a30-24gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    capacity = Partition.objects.get(gpu=gpu).memory_mib
    share = capacity // 2 + 1  # two of these cannot both fit
    a = deployment_create(
        name=f"a{attempt}", request=DeploymentRequest(kind="mps", memory_mib=share), replicas=1
    )
    b = deployment_create(
        name=f"b{attempt}", request=DeploymentRequest(kind="mps", memory_mib=share), replicas=1
    )
    outcomes = race(
        lambda: deployment_place(deployment_id=a.pk, gpu_id=gpu.pk),
        lambda: deployment_place(deployment_id=b.pk, gpu_id=gpu.pk),
    )
    errors = [o for o in outcomes if isinstance(o, ServiceError)]
    assert len(errors) == 1, outcomes
    assert errors[0].code == "placement.memory"
    assert errors[0].details["violations"][0]["details"]["rule"] == "mps.memory_overcommit"
    reserved = sum(Allocation.objects.filter(gpu=gpu).values_list("memory_mib", flat=True))
    assert reserved == share <= capacity


@pytest.mark.parametrize("attempt", range(3))
def test_two_mig_placements_never_share_a_partition_or_overlap(attempt):
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(
        gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("4g.40gb", 0),))
    )
    # Room for exactly one more 3g.40gb (at 4): both racers want it.
    a = deployment_create(
        name=f"a{attempt}", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    b = deployment_create(
        name=f"b{attempt}", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    outcomes = race(
        lambda: deployment_place(deployment_id=a.pk, gpu_id=gpu.pk),
        lambda: deployment_place(deployment_id=b.pk, gpu_id=gpu.pk),
    )
    assert sum(isinstance(o, ServiceError) for o in outcomes) == 1, outcomes
    starts = sorted(Partition.objects.filter(gpu=gpu).values_list("start", flat=True))
    assert starts == [0, 4]
    assert Allocation.objects.filter(gpu=gpu).count() == 1


@pytest.mark.parametrize("attempt", range(3))
def test_two_auto_placements_of_the_last_replica_place_it_once_and_neither_fails(attempt):
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mig"))
    deployment = deployment_create(
        name=f"d{attempt}", request=DeploymentRequest(kind="mig", profile="1g.10gb"), replicas=1
    )

    def autoplace():
        with transaction.atomic():
            return deployment_autoplace(deployment_id=deployment.pk)

    outcomes = race(autoplace, autoplace)
    # One placed it; the other found it placed (not "no capacity for 0 replica(s)").
    assert not [o for o in outcomes if isinstance(o, ServiceError)], outcomes
    assert sorted(len(o) for o in outcomes) == [0, 1], outcomes  # type: ignore[arg-type]
    assert Allocation.objects.filter(deployment=deployment).count() == 1
