"""Rolling updates: the new workload reaches the replicas max_surge at a time, each new copy
running before its old one stops; a failure rolls the updated replicas back."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleet.agents.documents import host_desired_state
from fleet.agents.messages import handle_message
from fleet.allocations.deployment_rollouts import deployment_rollout_start
from fleet.allocations.models import Allocation, AllocationState, Deployment
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import Conflict, ServiceError
from fleet.core.models import Operation, OperationStatus
from fleet.inventory.models import Host
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from fleet.workflows.deployment_rollouts import deployment_rollout_advance
from tests.factories import GpuFactory, HostFactory, allow_process

pytestmark = pytest.mark.django_db

V1 = {"runtime": "process", "command": ["/opt/serve", "--v1"]}
V2 = {"runtime": "process", "command": ["/opt/serve", "--v2"]}
FOUR_1G = LayoutSpec(mode="mig", instances=tuple(MigInstanceSpec("1g.10gb", s) for s in range(4)))


@pytest.fixture(autouse=True)
def _no_probation(settings):
    """These tests follow the surge and rollback logic: a copy counts as soon as it runs
    (min_ready_s 0), unless a test sets its own."""
    settings.FLEET_ROLLOUT_MIN_READY_SECONDS = 0


@pytest.fixture(autouse=True)
def _processes_allowed():
    """The replicas run processes: the default team's policy allows them."""
    allow_process()


@pytest.fixture
def host():
    host = HostFactory(runtime="process", process_runtime=True)
    for _ in range(2):
        gpu = GpuFactory(host=host, product_key="h100-sxm5-80gb")
        gpu_set_layout(gpu_id=gpu.pk, spec=FOUR_1G)
    return host


@pytest.fixture
def full_host():
    """One H100 cut into seven 1g.10gb instances: no room for any new one."""
    host = HostFactory(runtime="process", process_runtime=True)
    gpu = GpuFactory(host=host, product_key="h100-sxm5-80gb")
    seven = LayoutSpec(mode="mig", instances=tuple(MigInstanceSpec("1g.10gb", s) for s in range(7)))
    gpu_set_layout(gpu_id=gpu.pk, spec=seven)
    return host


def _report(host, states: dict[int, str]) -> None:
    handle_message(
        host.pk,
        {
            "type": "workloads",
            "ts": time.time(),
            "full": False,
            "workloads": [
                {
                    "allocation_id": pk,
                    "state": state,
                    "started_at": time.time() if state == "running" else None,
                    "exit_code": 1 if state in ("failed", "exited") else None,
                    "restarts": 0,
                    "message": "exit 1" if state == "failed" else "",
                    "pids": [],
                }
                for pk, state in states.items()
            ],
        },
    )


def _deployment(host, replicas: int = 2) -> Deployment:
    deployment = deployment_create(
        name="llm",
        request=DeploymentRequest(kind="mig", profile="1g.10gb"),
        replicas=replicas,
        workload=V1,
    )
    free = iter(Partition.objects.filter(gpu__host=host, kind="mig").order_by("gpu_id", "start"))
    for _ in range(replicas):
        deployment_place(deployment_id=deployment.pk, partition_id=next(free).pk)
    _report(host, dict.fromkeys(_copies(deployment), "running"))
    return deployment


def _copies(deployment: Deployment, **filters: Any) -> list[int]:
    rows = Allocation.objects.placed().filter(deployment=deployment, **filters)
    return list(rows.order_by("pk").values_list("pk", flat=True))


def _new_copy(deployment: Deployment) -> int:
    (pk,) = _copies(deployment, replaces__isnull=False)
    return pk


def _running(deployment: Deployment) -> int:
    rows = Allocation.objects.placed().filter(deployment=deployment, workload_state="running")
    return len(set(rows.values_list("replica", flat=True)))


def _commands(host) -> dict[int, list[str]]:
    document = host_desired_state(Host.objects.get(pk=host.pk))
    return {
        a["allocation_id"]: a["workload"]["command"]
        for gpu in document["gpus"].values()
        for a in gpu["allocations"]
    }


def test_a_rollout_updates_one_replica_at_a_time_without_dropping_any(host):
    deployment = _deployment(host)
    old = _copies(deployment)
    operation = deployment_rollout_start(deployment_id=deployment.pk, workload=V2)
    assert deployment_rollout_advance(operation_id=operation.pk) == "wait"
    first = _new_copy(deployment)  # max_surge 1: one new copy at a time
    assert _commands(host)[first] == V2["command"]
    assert all(_commands(host)[pk] == V1["command"] for pk in old)
    _report(host, {first: "starting"})
    assert _running(deployment) == 2
    _report(host, {first: "running"})  # replica 0 done: its old copy stops, replica 1 starts
    assert _running(deployment) == 2
    second = _new_copy(deployment)
    _report(host, {second: "running"})
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.payload
    assert sorted(operation.payload["updated"]) == [0, 1]
    assert Allocation.objects.filter(pk__in=old, state=AllocationState.RELEASING).count() == 2
    assert {tuple(Allocation.objects.get(pk=pk).workload["command"]) for pk in (first, second)} == {
        tuple(V2["command"])
    }
    assert Deployment.objects.get(pk=deployment.pk).workload["command"] == V2["command"]


def test_a_new_version_that_fails_rolls_the_updated_replicas_back(host):
    deployment = _deployment(host)
    operation = deployment_rollout_start(deployment_id=deployment.pk, workload=V2)
    deployment_rollout_advance(operation_id=operation.pk)
    _report(host, {_new_copy(deployment): "running"})  # replica 0 runs v2
    broken = _new_copy(deployment)
    _report(host, {broken: "failed"})  # replica 1's v2 fails: stop and roll back replica 0
    operation.refresh_from_db()
    assert operation.payload["step"] == "rolling_back"
    assert Deployment.objects.get(pk=deployment.pk).workload["command"] == V1["command"]
    back = _new_copy(deployment)
    assert _commands(host)[back] == V1["command"]
    assert _running(deployment) == 2
    _report(host, {back: "running"})
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert (
        "replica 1" in operation.reason and "went back to the previous workload" in operation.reason
    )
    commands = [Allocation.objects.get(pk=pk).workload["command"] for pk in _copies(deployment)]
    assert commands == [V1["command"], V1["command"]] and _running(deployment) == 2


def test_without_room_for_a_new_copy_the_rollout_fails_and_changes_nothing(full_host):
    host = full_host
    deployment = _deployment(host, replicas=7)  # every slice taken
    operation = deployment_rollout_start(deployment_id=deployment.pk, workload=V2)
    assert deployment_rollout_advance(operation_id=operation.pk) == "failed"
    operation.refresh_from_db()
    assert "no room for a new copy of replica 0" in operation.reason
    assert Deployment.objects.get(pk=deployment.pk).workload["command"] == V1["command"]
    assert _running(deployment) == 7


def test_max_unavailable_lets_a_replica_without_room_stop_and_start(full_host):
    host = full_host
    deployment = _deployment(host, replicas=7)
    first = Allocation.objects.get(deployment=deployment, replica=0).pk
    operation = deployment_rollout_start(
        deployment_id=deployment.pk, workload=V2, max_unavailable=1
    )
    assert deployment_rollout_advance(operation_id=operation.pk) == "wait"
    assert Allocation.objects.get(pk=first).state == AllocationState.RELEASING  # stopping
    assert _running(deployment) == 6
    _report(host, {first: "none"})  # it stopped: its slice is free, replica 0 goes there on v2
    (entry,) = Operation.objects.get(pk=operation.pk).payload["moving"].values()
    assert entry["move"] is None and _commands(host)[entry["allocation"]] == V2["command"]
    _report(host, {entry["allocation"]: "running"})  # replica 0 runs v2; replica 1 stops next
    payload = Operation.objects.get(pk=operation.pk).payload
    assert payload["updated"] == [0] and list(payload["moving"]) == ["1"]
    assert _running(deployment) == 6  # never more than max_unavailable down


def test_one_rollout_at_a_time_and_the_same_workload_changes_nothing(host):
    deployment = _deployment(host)
    same = deployment_rollout_start(deployment_id=deployment.pk, workload=V1)
    assert same.status == OperationStatus.SUCCEEDED and "already run" in same.reason
    deployment_rollout_start(deployment_id=deployment.pk, workload=V2)
    with pytest.raises(Conflict) as busy:
        deployment_rollout_start(deployment_id=deployment.pk, workload=V1)
    assert busy.value.code == "rollout.in_progress"
    with pytest.raises(ServiceError) as bad:
        deployment_rollout_start(deployment_id=deployment.pk, workload=V1, max_surge=0)
    assert bad.value.code == "rollout.invalid"
    assert Operation.objects.filter(kind="rollout").count() == 2


def _probation_over(operation: Operation) -> None:
    """Pretend the copies on probation have been running for an hour."""
    operation.refresh_from_db()
    payload = operation.payload
    for entry in payload["moving"].values():
        if "ready_since" in entry:
            entry["ready_since"] = "2000-01-01T00:00:00+00:00"
    Operation.objects.filter(pk=operation.pk).update(payload=payload)


def test_a_new_copy_counts_only_once_it_has_stayed_running_for_min_ready_s(host):
    deployment = _deployment(host, replicas=1)
    operation = deployment_rollout_start(deployment_id=deployment.pk, workload=V2, min_ready_s=30)
    deployment_rollout_advance(operation_id=operation.pk)
    copy = _new_copy(deployment)
    _report(host, {copy: "running"})  # the move is done; the copy is on probation
    operation.refresh_from_db()
    assert operation.status == OperationStatus.DISPATCHED
    assert operation.payload["updated"] == [] and operation.payload["min_ready_s"] == 30
    _probation_over(operation)
    assert deployment_rollout_advance(operation_id=operation.pk) == "done"
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED and operation.payload["updated"] == [0]


def test_a_version_that_starts_then_crashes_fails_the_rollout_and_rolls_back(host):
    """Issue 22, defect 3: a command that exits at once was reported running for a moment, the
    rollout was marked succeeded and the deployment ended with nothing running."""
    deployment = _deployment(host, replicas=2)
    operation = deployment_rollout_start(deployment_id=deployment.pk, workload=V2, min_ready_s=10)
    deployment_rollout_advance(operation_id=operation.pk)
    copy = _new_copy(deployment)
    _report(host, {copy: "running"})
    _report(host, {copy: "exited"})  # v2 ran for a moment, then exited
    operation.refresh_from_db()
    assert operation.payload["step"] == "rolling_back", operation.payload
    assert "exited after it started" in operation.payload["failure"]
    assert Deployment.objects.get(pk=deployment.pk).workload["command"] == V1["command"]
    back = _new_copy(deployment)  # replica 0 goes back to v1, make before break
    assert _commands(host)[back] == V1["command"]
    _report(host, {back: "running"})
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert _running(deployment) == 2


def test_min_ready_s_is_bounded():
    with pytest.raises(ServiceError) as refused:
        deployment_rollout_start(deployment_id=1, workload=V2, min_ready_s=-1)
    assert refused.value.code == "rollout.invalid"


def test_a_rollout_whose_deployment_is_gone_ends_and_blocks_no_other(host):
    """A deployment deleted mid-rollout (its operation's deployment set to null) ended every
    advance with an AssertionError: the moves, the other rollouts and the agents' reports
    stopped there (CI's browser tests, after a delete during a rollout's probation)."""
    from fleet.workflows.registry import workflows_advance as rollouts_advance

    deployment = _deployment(host)
    operation = deployment_rollout_start(deployment_id=deployment.pk, workload=V2)
    Allocation.objects.filter(deployment=deployment).delete()
    Deployment.objects.filter(pk=deployment.pk).delete()

    rollouts_advance()

    operation.refresh_from_db()
    assert operation.deployment_id is None
    assert operation.status == OperationStatus.FAILED
    assert "deleted" in operation.reason
