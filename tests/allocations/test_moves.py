"""Moves, make before break: the new copy starts on the target, the old one stops only once the
new one runs, and any failure leaves the old copy running and the target free."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from fleet.agents.documents import host_desired_state
from fleet.agents.messages import handle_message
from fleet.allocations.models import Allocation, AllocationState
from fleet.allocations.moves import allocation_move
from fleet.allocations.services import (
    DeploymentRequest,
    deployment_create,
    deployment_evict,
    deployment_place,
)
from fleet.core.errors import Conflict, NotFound, RuleViolation, ServiceError
from fleet.core.models import Operation, OperationStatus
from fleet.inventory.models import Host
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from fleet.workflows.moves import move_advance
from fleet.workflows.registry import workflows_advance
from tests.factories import GpuFactory, HostFactory, allow_process, dedicated_gpus
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _processes_allowed(db):
    """Replicas here run processes: the default team's policy allows them."""
    allow_process()


PROCESS = {"runtime": "process", "command": ["/opt/models/serve.sh"]}


def _mig_gpu(runtime: str = "process", profiles: tuple[str, ...] = ("3g.40gb",)):
    gpu = GpuFactory(
        host=HostFactory(runtime=runtime, process_runtime=True), product_key="h100-sxm5-80gb"
    )
    starts = iter((4, 0))
    gpu_set_layout(
        gpu_id=gpu.pk,
        spec=LayoutSpec(
            mode="mig",
            instances=tuple(MigInstanceSpec(profile=p, start=next(starts)) for p in profiles),
        ),
    )
    return gpu


@pytest.fixture
def two_gpus():
    return _mig_gpu(), _mig_gpu()


def _status(allocation_id: int, state: str, **extra: Any) -> dict[str, Any]:
    return {
        "allocation_id": allocation_id,
        "state": state,
        "started_at": time.time() if state == "running" else None,
        "exit_code": extra.get("exit_code"),
        "restarts": 0,
        "message": extra.get("message", ""),
        "pids": [],
    }


def _report(gpu, allocation_id: int, state: str, **extra: Any) -> None:
    """What the agent of ``gpu``'s host says, through the one dispatcher of agent messages."""
    handle_message(
        gpu.host_id,
        {
            "type": "workloads",
            "ts": time.time(),
            "full": False,
            "workloads": [_status(allocation_id, state, **extra)],
        },
    )


def _running_replica(gpu, workload: dict[str, Any] | None = PROCESS, name: str = "llm"):
    deployment = deployment_create(
        name=name,
        request=DeploymentRequest(kind="mig", profile="3g.40gb"),
        replicas=1,
        workload=workload,
    )
    partition = Partition.objects.get(gpu=gpu, profile_name="3g.40gb")
    deployment_place(deployment_id=deployment.pk, partition_id=partition.pk)
    allocation = Allocation.objects.get(deployment=deployment)
    if workload is not None:
        _report(gpu, allocation.pk, "running")
    return allocation


def _target(gpu) -> int:
    return Partition.objects.get(gpu=gpu, profile_name="3g.40gb").pk


def _running_copies(deployment_id: int) -> int:
    return Allocation.objects.filter(
        deployment_id=deployment_id, workload_state="running", state__in=["pending", "active"]
    ).count()


def test_the_new_copy_runs_before_the_old_one_stops(two_gpus):
    source, target = two_gpus
    old = _running_replica(source)
    operation = allocation_move(allocation_id=old.pk, partition_id=_target(target))
    assert operation.kind == "move" and operation.status == OperationStatus.DISPATCHED
    new = Allocation.objects.get(replaces=old)
    assert (new.replica, new.gpu_id) == (old.replica, target.pk)
    # Both copies are in their hosts' desired states: the target's agent starts the new one.
    assert [a["allocation_id"] for a in _desired(target)] == [new.pk]
    assert [a["allocation_id"] for a in _desired(source)] == [old.pk]
    assert move_advance(operation_id=operation.pk) == "wait"
    _report(target, new.pk, "starting")
    assert _running_copies(old.deployment_id) == 1
    old.refresh_from_db()
    assert old.state != AllocationState.RELEASING  # still serving
    # The new copy runs: the agent's report moves the move on; the old copy is stopped.
    _report(target, new.pk, "running")
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.reason
    assert "runs on" in operation.reason
    old.refresh_from_db()
    new.refresh_from_db()
    assert old.state == AllocationState.RELEASING and new.replaces_id is None
    assert _desired(source) == []
    assert _running_copies(old.deployment_id) == 1
    # The old copy has stopped: its slice is free.
    _report(source, old.pk, "none", exit_code=0)
    assert not Allocation.objects.filter(pk=old.pk).exists()
    steps = [s["note"] for s in operation.payload["log"]]
    assert steps[0].startswith("reserved") and any("waiting" in s for s in steps)


def _desired(gpu) -> list[dict[str, Any]]:
    document = host_desired_state(Host.objects.get(pk=gpu.host_id))
    return document["gpus"][gpu.uuid]["allocations"]


@pytest.mark.parametrize("state", ["failed", "crashloop", "exited"])
def test_a_new_copy_that_fails_leaves_the_old_one_running_and_frees_the_target(two_gpus, state):
    source, target = two_gpus
    old = _running_replica(source)
    operation = allocation_move(allocation_id=old.pk, partition_id=_target(target))
    new = Allocation.objects.get(replaces=old)
    _report(target, new.pk, state, exit_code=1, message="exit 1")
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert state in operation.reason and "old copy keeps running" in operation.reason
    old.refresh_from_db()
    assert old.state != AllocationState.RELEASING and old.workload_state == "running"
    # The target is given back: at once when the copy cannot be running, else once the agent
    # has stopped it (a crash loop may be between two tries).
    assert not Allocation.objects.placed().filter(pk=new.pk).exists()
    assert _desired(target) == []
    assert [a["allocation_id"] for a in _desired(source)] == [old.pk]


def test_a_new_copy_that_never_runs_is_rolled_back_at_the_deadline(two_gpus):
    source, target = two_gpus
    old = _running_replica(source)
    operation = allocation_move(allocation_id=old.pk, partition_id=_target(target), timeout_s=10)
    new = Allocation.objects.get(replaces=old)
    _report(target, new.pk, "starting")
    payload = dict(operation.payload, deadline=(timezone.now() - timedelta(seconds=1)).isoformat())
    Operation.objects.filter(pk=operation.pk).update(payload=payload)
    assert workflows_advance() == ["failed"]
    operation.refresh_from_db()
    assert "not running within 10 s" in operation.reason
    # It may still be starting: it keeps its slice until the agent has stopped it.
    new.refresh_from_db()
    assert new.state == AllocationState.RELEASING
    old.refresh_from_db()
    assert old.state != AllocationState.RELEASING


def test_a_replica_fleet_does_not_run_moves_at_once(two_gpus):
    source, target = two_gpus
    old = _running_replica(source, workload=None)
    operation = allocation_move(allocation_id=old.pk, partition_id=_target(target))
    assert not operation.payload["make_before_break"]
    assert operation.status == OperationStatus.SUCCEEDED and "launcher" in operation.reason
    assert not Allocation.objects.filter(pk=old.pk).exists()
    assert Allocation.objects.get(deployment_id=old.deployment_id).gpu_id == target.pk


def test_evicting_the_replica_during_a_move_stops_both_copies(two_gpus):
    source, target = two_gpus
    old = _running_replica(source)
    operation = allocation_move(allocation_id=old.pk, partition_id=_target(target))
    new = Allocation.objects.get(replaces=old)
    deployment_evict(deployment_id=old.deployment_id, replica=old.replica)
    assert set(Allocation.objects.placed().filter(deployment_id=old.deployment_id)) == set()
    assert move_advance(operation_id=operation.pk) == "failed"
    assert not Allocation.objects.filter(pk=new.pk, state="active").exists()


def test_a_move_to_the_same_slice_or_a_busy_one_is_refused_and_changes_nothing(two_gpus):
    source, target = two_gpus
    old = _running_replica(source)
    blocker = _running_replica(target, name="other")
    with pytest.raises(Conflict) as same:
        allocation_move(allocation_id=old.pk, partition_id=old.partition_id)
    assert same.value.code == "move.same_target"
    with pytest.raises(RuleViolation):
        allocation_move(allocation_id=old.pk, partition_id=blocker.partition_id)
    with pytest.raises(ServiceError) as neither:
        allocation_move(allocation_id=old.pk)
    assert neither.value.code == "move.target_required"
    with pytest.raises(NotFound):
        allocation_move(allocation_id=999_999, gpu_id=target.pk)
    assert not Operation.objects.filter(kind="move").exists()
    assert Allocation.objects.count() == 2


def test_a_replica_moves_once_at_a_time(two_gpus):
    source, target = two_gpus
    third = _mig_gpu()
    old = _running_replica(source)
    allocation_move(allocation_id=old.pk, partition_id=_target(target))
    with pytest.raises(Conflict) as again:
        allocation_move(allocation_id=old.pk, partition_id=_target(third))
    assert again.value.code == "move.in_progress"
    new = Allocation.objects.get(replaces=old)
    with pytest.raises(Conflict):
        allocation_move(allocation_id=new.pk, partition_id=_target(third))


def test_a_releasing_replica_cannot_move(two_gpus):
    source, target = two_gpus
    old = _running_replica(source)
    deployment_evict(deployment_id=old.deployment_id)
    with pytest.raises(Conflict) as refused:
        allocation_move(allocation_id=old.pk, partition_id=_target(target))
    assert refused.value.code == "move.not_placed"


def test_an_mps_share_moves_onto_another_gpus_daemon():
    def mps_gpu():
        gpu = GpuFactory(
            host=HostFactory(runtime="process", process_runtime=True), product_key="h100-sxm5-80gb"
        )
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps"))
        return gpu

    source, target = mps_gpu(), mps_gpu()
    deployment = deployment_create(
        name="share",
        request=DeploymentRequest(kind="mps", memory_mib=8192, max_compute_percent=25),
        replicas=1,
        workload=PROCESS,
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=source.pk)
    old = Allocation.objects.get(deployment=deployment)
    _report(source, old.pk, "running")
    allocation_move(allocation_id=old.pk, gpu_id=target.pk)
    new = Allocation.objects.get(replaces=old)
    assert (new.memory_mib, new.compute_percent, new.gpu_id) == (8192, 25, target.pk)
    _report(target, new.pk, "running")
    old.refresh_from_db()
    assert old.state == AllocationState.RELEASING


# -- the API ------------------------------------------------------------------------------------


def test_the_api_moves_a_replica_for_operators_only(two_gpus, operator_client, viewer_client):
    source, target = two_gpus
    old = _running_replica(source)
    url = f"/api/v1/allocations/{old.pk}/move"
    body = {"partition": _target(target)}
    assert_error(viewer_client.post(url, body, format="json"), 403)
    response = operator_client.post(url, body, format="json")
    assert response.status_code == 202, response.json()
    assert response.json()["kind"] == "move"
    listed = operator_client.get(f"/api/v1/allocations/?deployment={old.deployment_id}").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert sorted(r["replaces"] or 0 for r in rows) == [0, old.pk]


@pytest.mark.parametrize(
    "body",
    [{}, {"partition": 1, "gpu": 1}, {"partition": "x"}, {"gpu": 0}, {"gpu": 1, "timeout_s": 5}],
)
def test_a_bad_move_request_is_refused_and_changes_nothing(two_gpus, operator_client, body):
    source, _ = two_gpus
    old = _running_replica(source)
    response = operator_client.post(f"/api/v1/allocations/{old.pk}/move", body, format="json")
    assert_error(response, 400)
    assert Allocation.objects.count() == 1 and not Operation.objects.filter(kind="move").exists()


def test_moving_an_unknown_allocation_is_a_404(operator_client):
    response = operator_client.post("/api/v1/allocations/424242/move", {"gpu": 1}, format="json")
    assert_error(response, 404, "allocation.not_found")


# -- a replica of several whole GPUs moves as one copy ---------------------------------------


@pytest.fixture
def two_hosts_of_two():
    """A replica of 2 whole GPUs running on host a; host b has 2 free dedicated GPUs."""
    hosts = [HostFactory(runtime="process", process_runtime=True) for _ in range(2)]
    gpus = [dedicated_gpus(host, 2) for host in hosts]
    deployment = deployment_create(
        name="train",
        request=DeploymentRequest(kind="gpu", gpu_count=2),
        replicas=1,
        workload=PROCESS,
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=gpus[0][0].pk)
    olds = list(Allocation.objects.filter(deployment=deployment).order_by("gpu_slot"))
    _report(gpus[0][0], olds[0].pk, "running")
    return gpus, olds


def test_a_replica_of_two_gpus_moves_make_before_break_as_one_copy(two_hosts_of_two):
    gpus, olds = two_hosts_of_two
    # Asked through its second GPU's allocation: the whole replica moves.
    operation = allocation_move(allocation_id=olds[1].pk, gpu_id=gpus[1][0].pk)
    news = list(Allocation.objects.filter(replaces__in=olds).order_by("gpu_slot"))
    assert [n.replaces_id for n in news] == [o.pk for o in olds]
    assert sorted(n.gpu_id for n in news) == sorted(g.pk for g in gpus[1])
    assert operation.payload["to_allocations"] == [n.pk for n in news]
    desired = _desired(gpus[1][0]) + _desired(gpus[1][1])
    (runs,) = [a for a in desired if a["workload"]["runtime"] != "none"]
    assert runs["allocation_id"] == news[0].pk and len(runs["devices"]) == 2
    assert move_advance(operation_id=operation.pk) == "wait"
    _report(gpus[1][0], news[0].pk, "running")
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.reason
    for old in olds:
        old.refresh_from_db()
        assert old.state == AllocationState.RELEASING
    assert not Allocation.objects.filter(pk__in=[n.pk for n in news], replaces__isnull=False)
    # The old copy's workload stopped: both its GPUs are free, together.
    handle_message(
        gpus[0][0].host_id, {"type": "workloads", "ts": time.time(), "full": True, "workloads": []}
    )
    assert not Allocation.objects.filter(pk__in=[o.pk for o in olds]).exists()


def test_a_failed_new_copy_of_two_gpus_frees_both_targets_and_keeps_the_old(two_hosts_of_two):
    gpus, olds = two_hosts_of_two
    operation = allocation_move(allocation_id=olds[0].pk, gpu_id=gpus[1][0].pk)
    news = list(Allocation.objects.filter(replaces__in=olds).order_by("gpu_slot"))
    _report(gpus[1][0], news[0].pk, "failed", message="no such file")
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED and "no such file" in operation.reason
    assert set(
        Allocation.objects.filter(pk__in=[n.pk for n in news]).values_list("state", flat=True)
    ) <= {AllocationState.RELEASING}
    assert list(Allocation.objects.placed().filter(deployment=olds[0].deployment)) == olds


def test_a_replica_of_two_gpus_moves_to_a_gpu_not_a_partition(two_hosts_of_two):
    gpus, olds = two_hosts_of_two
    whole = Partition.objects.get(gpu=gpus[1][0])
    with pytest.raises(ServiceError) as refused:
        allocation_move(allocation_id=olds[0].pk, partition_id=whole.pk)
    assert refused.value.code == "move.target_required"
    with pytest.raises(Conflict) as same:
        allocation_move(allocation_id=olds[0].pk, gpu_id=gpus[0][1].pk)
    assert same.value.code == "move.same_target"
    assert not Allocation.objects.filter(replaces__isnull=False).exists()
