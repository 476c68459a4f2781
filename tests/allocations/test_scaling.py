"""Scaling a deployment: new replicas wait (or are placed, when auto-placed), the newest stop
first through eviction, bad input and deleting deployments change nothing, and a scale
serialises with placements under the deployment's row lock."""

from __future__ import annotations

import pytest
from django.db import connection

from fleet.allocations.autoplace import deployment_create_placed
from fleet.allocations.models import Allocation, AllocationState, Deployment, WorkloadState
from fleet.allocations.scaling import deployment_scale, deployment_update
from fleet.allocations.services import (
    DeploymentRequest,
    deployment_create,
    deployment_delete,
    deployment_place,
)
from fleet.core.errors import Conflict, NotFound, RuleViolation, ServiceError
from fleet.core.models import Operation, OperationKind
from fleet.inventory.models import Host
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory, allow_process
from tests.helpers import race, snapshot_rows

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _processes_allowed(db):
    """Replicas here run processes: the default team's policy allows them."""
    allow_process()


PROCESS = {"runtime": "process", "command": ["/bin/sh", "-c", "sleep 1000"], "stop_grace_s": 5}
SHARE = DeploymentRequest(kind="mps", memory_mib=2048, max_compute_percent=10)


@pytest.fixture
def mps_gpu():
    gpu = GpuFactory(
        host=HostFactory(runtime="process", process_runtime=True), product_key="h100-sxm5-80gb"
    )
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    return gpu


def placed_deployment(gpu, *, replicas=3, placed=3, workload=None, name="feature-worker"):
    deployment = deployment_create(name=name, request=SHARE, replicas=replicas, workload=workload)
    for _ in range(placed):
        deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)
    return deployment


def placed_replicas(deployment) -> list[int]:
    return sorted(
        Allocation.objects.placed().filter(deployment=deployment).values_list("replica", flat=True)
    )


def test_scaling_up_adds_replicas_that_wait_to_be_placed(mps_gpu):
    deployment = placed_deployment(mps_gpu, replicas=2, placed=2)

    operation = deployment_scale(deployment_id=deployment.pk, replicas=4)

    deployment.refresh_from_db()
    assert deployment.replicas == 4
    assert placed_replicas(deployment) == [0, 1]  # the two new ones wait in the tray
    assert operation is not None and operation.kind == OperationKind.SCALE
    assert operation.status == "succeeded" and operation.deployment_id == deployment.pk
    assert operation.payload == {"from": 2, "to": 4}
    assert "from 2 to 4" in operation.summary


def test_scaling_up_an_auto_placed_deployment_places_the_new_replicas(mps_gpu):
    deployment = deployment_create_placed(name="auto", request=SHARE, replicas=2)
    assert Deployment.objects.get(pk=deployment.pk).auto_place

    operation = deployment_scale(deployment_id=deployment.pk, replicas=4)

    assert placed_replicas(deployment) == [0, 1, 2, 3]
    assert operation is not None and len(operation.payload["placed"]) == 2
    assert Operation.objects.filter(pk__in=operation.payload["placed"], kind="place").count() == 2


def test_an_auto_placed_deployment_without_room_for_every_new_replica_changes_nothing(mps_gpu):
    deployment = deployment_create_placed(
        name="big", request=DeploymentRequest(kind="mps", memory_mib=30_000), replicas=2
    )
    before = snapshot_rows()

    with pytest.raises(RuleViolation):
        deployment_scale(deployment_id=deployment.pk, replicas=5)  # 5 x 30 GB > 80 GB

    assert snapshot_rows() == before


def test_scaling_down_stops_the_newest_replicas_first(mps_gpu):
    deployment = placed_deployment(mps_gpu, replicas=4, placed=4)
    generation = Host.objects.get(pk=mps_gpu.host_id).desired_generation

    operation = deployment_scale(deployment_id=deployment.pk, replicas=2)

    assert placed_replicas(deployment) == [0, 1]
    assert Deployment.objects.get(pk=deployment.pk).replicas == 2
    assert operation is not None and operation.payload["stopped_replicas"] == [3, 2]
    evict = Operation.objects.get(pk__in=operation.payload["evicted"])
    assert evict.kind == "evict" and evict.payload["replicas"] == [2, 3]
    # The agent is told: a new desired generation without the two replicas.
    assert Host.objects.get(pk=mps_gpu.host_id).desired_generation == generation + 1


def test_scaling_down_keeps_the_slices_of_running_workloads_until_they_stop(mps_gpu):
    deployment = placed_deployment(mps_gpu, replicas=3, placed=3, workload=PROCESS)
    Allocation.objects.filter(deployment=deployment).update(workload_state=WorkloadState.RUNNING)

    deployment_scale(deployment_id=deployment.pk, replicas=1)

    rows = Allocation.objects.filter(deployment=deployment).order_by("replica")
    assert [(a.replica, a.state) for a in rows] == [
        (0, AllocationState.PENDING),
        (1, AllocationState.RELEASING),
        (2, AllocationState.RELEASING),
    ]


def test_scaling_down_forgets_unplaced_replicas_and_evicts_only_placed_ones(mps_gpu):
    deployment = placed_deployment(mps_gpu, replicas=5, placed=2)  # replicas 0 and 1 placed

    operation = deployment_scale(deployment_id=deployment.pk, replicas=1)

    assert placed_replicas(deployment) == [0]
    assert operation is not None and operation.payload["stopped_replicas"] == [1]


def test_scaling_to_the_current_count_records_nothing(mps_gpu):
    deployment = placed_deployment(mps_gpu, replicas=2, placed=1)
    before = snapshot_rows()

    assert deployment_scale(deployment_id=deployment.pk, replicas=2) is None
    assert snapshot_rows() == before


@pytest.mark.parametrize("replicas", [0, -1, 1001, "3", 2.5, None, True])
def test_an_invalid_replica_count_is_refused_and_changes_nothing(mps_gpu, replicas):
    deployment = placed_deployment(mps_gpu, replicas=2, placed=2)
    before = snapshot_rows()

    with pytest.raises(ServiceError) as refused:
        deployment_update(deployment_id=deployment.pk, changes={"replicas": replicas})

    assert refused.value.code == "deployment.replicas_invalid"
    assert snapshot_rows() == before


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"replicas": 3, "workload": PROCESS}, "deployment.one_change"),
        ({"workload": PROCESS, "rollout": {"max_surge": 0}}, "rollout.invalid"),
        ({"workload": PROCESS, "rollout": {"speed": 2}}, "rollout.invalid"),
        ({"replicas": 3, "rollout": {}}, "rollout.invalid"),
        ({"replicas": 3, "memory_mib": 4096}, "deployment.field_immutable"),
        ({"kind": "mig", "profile": "1g.10gb"}, "deployment.field_immutable"),
        ({"name": "renamed"}, "deployment.field_immutable"),
        ({"replicas": 3, "colour": "blue"}, "deployment.field_unknown"),
        ({}, "deployment.replicas_required"),
    ],
)
def test_changes_other_than_the_replica_count_are_refused(mps_gpu, changes, code):
    deployment = placed_deployment(mps_gpu, replicas=2, placed=2)
    before = snapshot_rows()

    with pytest.raises(ServiceError) as refused:
        deployment_update(deployment_id=deployment.pk, changes=changes)

    assert refused.value.code == code and refused.value.status_code == 400
    assert snapshot_rows() == before


def test_a_workload_change_is_a_rolling_update(mps_gpu):
    deployment = placed_deployment(mps_gpu, replicas=1, placed=0)
    operation = deployment_update(deployment_id=deployment.pk, changes={"workload": PROCESS})
    assert operation is not None and operation.kind == "rollout"
    deployment.refresh_from_db()
    assert deployment.workload["command"] == PROCESS["command"]


def test_a_deployment_being_deleted_cannot_be_scaled(mps_gpu):
    deployment = placed_deployment(mps_gpu, replicas=2, placed=2, workload=PROCESS)
    Allocation.objects.filter(deployment=deployment).update(workload_state=WorkloadState.RUNNING)
    deployment_delete(deployment_id=deployment.pk)  # stays, deleting, while workloads stop
    before = snapshot_rows()

    with pytest.raises(Conflict) as refused:
        deployment_scale(deployment_id=deployment.pk, replicas=3)

    assert refused.value.code == "deployment.deleting"
    assert snapshot_rows() == before


def test_a_missing_deployment_is_not_found():
    with pytest.raises(NotFound):
        deployment_scale(deployment_id=999_999, replicas=2)


# -- concurrency: needs real concurrent transactions (PostgreSQL) --------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(4))
def test_a_scale_down_racing_a_placement_never_leaves_a_replica_past_the_count(attempt):
    if connection.vendor != "postgresql":
        pytest.skip("the race needs PostgreSQL (set FLEET_DATABASE_URL); SQLite serialises writers")
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    deployment = placed_deployment(gpu, replicas=3, placed=1, name=f"race-{attempt}")

    outcomes = race(
        lambda: deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk),
        lambda: deployment_scale(deployment_id=deployment.pk, replicas=1),
    )

    # Either the placement came first and the scale evicted it, or the scale came first and
    # the placement found every wanted replica placed: never replica 1 placed with 1 wanted.
    assert not isinstance(outcomes[1], ServiceError), outcomes
    assert Deployment.objects.get(pk=deployment.pk).replicas == 1
    assert placed_replicas(deployment) == [0]
    if isinstance(outcomes[0], ServiceError):
        assert outcomes[0].code == "deployment.fully_placed"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(3))
def test_two_racing_scales_serialise(attempt):
    if connection.vendor != "postgresql":
        pytest.skip("the race needs PostgreSQL (set FLEET_DATABASE_URL); SQLite serialises writers")
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    deployment = placed_deployment(gpu, replicas=4, placed=4, name=f"twice-{attempt}")

    outcomes = race(
        lambda: deployment_scale(deployment_id=deployment.pk, replicas=1),
        lambda: deployment_scale(deployment_id=deployment.pk, replicas=2),
    )

    assert not any(isinstance(o, ServiceError) for o in outcomes), outcomes
    assert Deployment.objects.get(pk=deployment.pk).replicas in (1, 2)
    # Whichever came first, replica 1 went with the scale to 1 (and came back only as wanted).
    assert placed_replicas(deployment) == [0]
    scales = Operation.objects.filter(deployment=deployment, kind="scale").order_by("id")
    # Each saw the count the other left: the second's "from" is the first's "to".
    assert scales[0].payload["from"] == 4 and scales[1].payload["from"] == scales[0].payload["to"]
