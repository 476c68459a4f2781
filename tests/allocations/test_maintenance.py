"""Hosts in maintenance: cordon, uncordon, and a host drain that moves every replica off, make
before break, one at a time, then leaves the host in maintenance."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.agents.messages import handle_message
from fleet.allocations.maintenance import (
    host_cordon,
    host_drain,
    host_uncordon,
)
from fleet.allocations.models import Allocation, AllocationState
from fleet.allocations.rankings import deployment_ranking
from fleet.allocations.selectors import fleet_snapshot
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import Conflict, ServiceError
from fleet.core.models import Operation, OperationStatus
from fleet.inventory.models import Host, HostStatus
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from fleet.workflows.host_drain import host_drain_advance
from fleet.workflows.registry import workflows_advance as host_drains_advance
from tests.factories import GpuFactory, HostFactory, allow_process, dedicated_gpus

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _processes_allowed(db):
    """Replicas here run processes: the default team's policy allows them."""
    allow_process()


PROCESS = {"runtime": "process", "command": ["/opt/models/serve.sh"]}


def _mig_host(name: str, instances: int = 2):
    gpu = GpuFactory(
        host=HostFactory(name=name, runtime="process", process_runtime=True),
        product_key="h100-sxm5-80gb",
    )
    starts = (4, 0)[:instances]
    gpu_set_layout(
        gpu_id=gpu.pk,
        spec=LayoutSpec(
            mode="mig",
            instances=tuple(MigInstanceSpec(profile="3g.40gb", start=s) for s in starts),
        ),
    )
    return gpu


def _report(host_id: int, workloads: list[tuple[int, str]]) -> None:
    handle_message(
        host_id,
        {
            "type": "workloads",
            "ts": time.time(),
            "full": False,
            "workloads": [
                {
                    "allocation_id": pk,
                    "state": state,
                    "started_at": time.time() if state == "running" else None,
                    "exit_code": 0 if state == "none" else None,
                    "restarts": 0,
                    "message": "",
                    "pids": [],
                }
                for pk, state in workloads
            ],
        },
    )


def _two_running_replicas(gpu, name: str = "llm") -> list[Allocation]:
    deployment = deployment_create(
        name=name,
        request=DeploymentRequest(kind="mig", profile="3g.40gb"),
        replicas=2,
        workload=PROCESS,
    )
    for partition in Partition.objects.filter(gpu=gpu).order_by("start"):
        deployment_place(deployment_id=deployment.pk, partition_id=partition.pk)
    allocations = list(Allocation.objects.filter(deployment=deployment).order_by("replica"))
    _report(gpu.host_id, [(a.pk, "running") for a in allocations])
    return allocations


def _running(deployment_id: int) -> int:
    return Allocation.objects.filter(
        deployment_id=deployment_id, workload_state="running", state__in=["pending", "active"]
    ).count()


def _status(host_id: int) -> str:
    return Host.objects.get(pk=host_id).status


def test_a_cordoned_host_takes_no_new_replica_and_uncordon_returns_it():
    gpu = _mig_host("gpu-a")
    deployment = deployment_create(
        name="llm", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )

    operation = host_cordon(host_id=gpu.host_id)

    assert operation.kind == "cordon_host" and operation.status == OperationStatus.SUCCEEDED
    assert _status(gpu.host_id) == HostStatus.CORDONED
    assert fleet_snapshot().host(gpu.host_id).cordoned  # type: ignore[union-attr]
    ranking = deployment_ranking(deployment)
    assert ranking.best is None
    codes = {v.code for r in ranking.infeasible for v in r.violations}
    assert "placement.cordoned" in codes
    host_uncordon(host_id=gpu.host_id)
    assert _status(gpu.host_id) == HostStatus.READY
    assert deployment_ranking(deployment).best is not None


def test_an_offline_host_cannot_be_cordoned_and_a_ready_one_not_uncordoned():
    gpu = _mig_host("gpu-a")
    Host.objects.filter(pk=gpu.host_id).update(status=HostStatus.OFFLINE)
    with pytest.raises(Conflict) as refused:
        host_cordon(host_id=gpu.host_id)
    assert refused.value.code == "host.not_ready"
    Host.objects.filter(pk=gpu.host_id).update(status=HostStatus.READY)
    with pytest.raises(Conflict) as nothing:
        host_uncordon(host_id=gpu.host_id)
    assert nothing.value.code == "host.not_cordoned"


def test_a_drain_with_room_elsewhere_moves_each_replica_before_break_then_marks_maintenance():
    source = _mig_host("gpu-a")
    target = _mig_host("gpu-b")
    old = _two_running_replicas(source)
    deployment_id = old[0].deployment_id

    operation = host_drain(host_id=source.host_id)
    assert operation.kind == "drain_host" and _status(source.host_id) == HostStatus.DRAINING
    assert host_drain_advance(operation_id=operation.pk) == "wait"
    # One at a time: the first replica has a new copy on the target, the second waits.
    first = Allocation.objects.get(replaces=old[0])
    assert first.gpu_id == target.pk
    assert not Allocation.objects.filter(replaces=old[1]).exists()
    assert _running(deployment_id) == 2
    _report(target.host_id, [(first.pk, "running")])  # its move ends; the drain goes on
    second = Allocation.objects.get(replaces=old[1])
    assert second.gpu_id == target.pk
    assert _running(deployment_id) == 2
    _report(target.host_id, [(first.pk, "running"), (second.pk, "running")])
    operation.refresh_from_db()
    assert operation.payload["step"] == "wait_empty"
    assert _status(source.host_id) == HostStatus.DRAINING  # the old copies are stopping
    _report(source.host_id, [(old[0].pk, "none"), (old[1].pk, "none")])

    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.reason
    assert "maintenance" in operation.reason
    assert _status(source.host_id) == HostStatus.MAINTENANCE
    assert len(operation.payload["moves"]) == 2
    assert not Allocation.objects.filter(gpu__host_id=source.host_id).exists()
    assert _running(deployment_id) == 2
    assert fleet_snapshot().host(source.host_id).cordoned  # type: ignore[union-attr]
    host_uncordon(host_id=source.host_id)
    assert _status(source.host_id) == HostStatus.READY


def test_a_drain_without_room_reports_the_stuck_replica_and_stops_nothing():
    source = _mig_host("gpu-a")
    target = _mig_host("gpu-b")
    other = deployment_create(
        name="other", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    taken = Partition.objects.filter(gpu=target).first()
    assert taken is not None
    deployment_place(deployment_id=other.pk, partition_id=taken.pk)  # room for one of two
    old = _two_running_replicas(source)

    operation = host_drain(host_id=source.host_id, timeout_s=60)
    host_drain_advance(operation_id=operation.pk)
    first = Allocation.objects.get(replaces=old[0])
    _report(first.gpu.host_id, [(first.pk, "running")])

    operation.refresh_from_db()
    assert operation.status == OperationStatus.DISPATCHED
    assert list(operation.payload["stuck"]) == [str(old[1].pk)]
    assert "llm[1]" in operation.payload["waiting_for"]
    assert "nowhere to go" in operation.payload["waiting_for"]
    assert Allocation.objects.get(pk=old[1].pk).state != AllocationState.RELEASING
    # At the deadline the drain fails, says why, and the host stays cordoned; nothing stops.
    payload = dict(operation.payload, deadline=(timezone.now() - timedelta(seconds=1)).isoformat())
    Operation.objects.filter(pk=operation.pk).update(payload=payload)
    assert host_drains_advance() == ["failed"]
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert "llm[1]" in operation.reason and "stays cordoned" in operation.reason
    assert _status(source.host_id) == HostStatus.CORDONED
    assert Allocation.objects.get(pk=old[1].pk).workload_state == "running"


def test_a_forced_drain_stops_the_replica_with_nowhere_to_go():
    source = _mig_host("gpu-a")
    old = _two_running_replicas(source)

    operation = host_drain(host_id=source.host_id, force=True)
    host_drain_advance(operation_id=operation.pk)

    operation.refresh_from_db()
    assert operation.payload["stopped"] == ["llm[0]", "llm[1]"]
    assert all(
        a.state == AllocationState.RELEASING
        for a in Allocation.objects.filter(pk__in=[o.pk for o in old])
    )
    _report(source.host_id, [(a.pk, "none") for a in old])
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED
    assert _status(source.host_id) == HostStatus.MAINTENANCE


def test_a_scheduled_drain_waits_until_its_time_and_uncordon_cancels_it():
    gpu = _mig_host("gpu-a")
    at = timezone.now() + timedelta(hours=2)

    operation = host_drain(host_id=gpu.host_id, at=at)

    assert operation.status == OperationStatus.PENDING
    assert operation.payload["step"] == "scheduled"
    assert host_drain_advance(operation_id=operation.pk) == "wait"
    assert _status(gpu.host_id) == HostStatus.READY  # placements go on until then
    with pytest.raises(Conflict) as twice:
        host_drain(host_id=gpu.host_id)
    assert twice.value.code == "host.drain_in_progress"
    host_uncordon(host_id=gpu.host_id)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED and "cancelled" in operation.reason
    assert _status(gpu.host_id) == HostStatus.READY


def test_a_scheduled_drain_starts_when_its_time_has_come():
    gpu = _mig_host("gpu-a")
    operation = host_drain(host_id=gpu.host_id, at=timezone.now() + timedelta(minutes=5))
    payload = dict(operation.payload, at=(timezone.now() - timedelta(seconds=1)).isoformat())
    Operation.objects.filter(pk=operation.pk).update(payload=payload)

    assert host_drains_advance() == ["done"]  # an empty host: straight to maintenance

    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED
    assert _status(gpu.host_id) == HostStatus.MAINTENANCE


@pytest.mark.parametrize(
    "at", [timedelta(seconds=-5), timedelta(days=31)], ids=["in the past", "too far ahead"]
)
def test_a_drain_at_a_time_in_the_past_or_too_far_ahead_is_refused(at):
    gpu = _mig_host("gpu-a")
    with pytest.raises(ServiceError) as refused:
        host_drain(host_id=gpu.host_id, at=timezone.now() + at)
    assert refused.value.code == "drain.at_invalid"
    assert not Operation.objects.filter(kind="drain_host").exists()
    assert _status(gpu.host_id) == HostStatus.READY


def test_a_replica_requiring_a_label_drains_only_to_a_host_carrying_it():
    source = _mig_host("gpu-a")
    Host.objects.filter(pk=source.host_id).update(labels={"zone": "a"})
    unlabelled = _mig_host("gpu-b")
    labelled = _mig_host("gpu-c")
    Host.objects.filter(pk=labelled.host_id).update(labels={"zone": "a"})
    deployment = deployment_create(
        name="llm",
        request=DeploymentRequest(kind="mig", profile="3g.40gb"),
        replicas=1,
        workload=PROCESS,
        host_labels={"zone": "a"},
    )
    partition = Partition.objects.filter(gpu=source).first()
    assert partition is not None
    deployment_place(deployment_id=deployment.pk, partition_id=partition.pk)
    old = Allocation.objects.get(deployment=deployment)

    operation = host_drain(host_id=source.host_id)
    host_drain_advance(operation_id=operation.pk)

    new = Allocation.objects.get(replaces=old)
    assert new.gpu_id == labelled.pk != unlabelled.pk


def test_a_stuck_replica_is_tried_again_once_room_appears():
    source = _mig_host("gpu-a")
    old = _two_running_replicas(source)
    operation = host_drain(host_id=source.host_id)
    host_drain_advance(operation_id=operation.pk)
    operation.refresh_from_db()
    assert len(operation.payload["stuck"]) == 2
    target = _mig_host("gpu-b")  # room appears
    # Not ranked again at once (every workload report of the fleet advances the drain).
    assert host_drain_advance(operation_id=operation.pk) == "wait"
    assert not Allocation.objects.filter(replaces=old[0]).exists()
    payload = dict(operation.payload, tried_at=(timezone.now() - timedelta(seconds=10)).isoformat())
    Operation.objects.filter(pk=operation.pk).update(payload=payload)

    host_drain_advance(operation_id=operation.pk)

    assert Allocation.objects.get(replaces=old[0]).gpu_id == target.pk


def test_a_drain_moves_a_replica_of_two_gpus_before_break_as_one_copy():
    hosts = [HostFactory(name=f"pair-{n}", runtime="process", process_runtime=True) for n in "ab"]
    gpus = {h.pk: dedicated_gpus(h, 2) for h in hosts}
    deployment = deployment_create(
        name="train",
        request=DeploymentRequest(kind="gpu", gpu_count=2),
        replicas=1,
        workload=PROCESS,
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=gpus[hosts[0].pk][0].pk)
    olds = list(Allocation.objects.filter(deployment=deployment).order_by("gpu_slot"))
    _report(hosts[0].pk, [(olds[0].pk, "running")])

    operation = host_drain(host_id=hosts[0].pk)
    assert host_drain_advance(operation_id=operation.pk) == "wait"
    news = list(Allocation.objects.filter(replaces__in=olds).order_by("gpu_slot"))
    assert {n.gpu.host_id for n in news} == {hosts[1].pk} and len(news) == 2
    assert _running(deployment.pk) == 2  # the old copy, on both its GPUs
    _report(hosts[1].pk, [(news[0].pk, "running")])
    _report(hosts[0].pk, [(olds[0].pk, "none")])  # the old copy has stopped

    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.reason
    assert not Allocation.objects.filter(gpu__host_id=hosts[0].pk).exists()
    assert _running(deployment.pk) == 2  # the new copy, on both its GPUs
