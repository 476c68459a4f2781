"""Repack that applies: the planner's moves carried out GPU by GPU (make before break), at most
``max_unavailable`` GPUs at a time, the GPUs freed in the result."""

from __future__ import annotations

import pytest

from fleet.agents.delivery import agent_ack
from fleet.agents.discovery import agent_hello
from fleet.agents.documents import host_desired_state
from fleet.agents.enrollment import host_issue_token
from fleet.allocations.models import Allocation
from fleet.allocations.planning.repack_plans import capacity_repack_plan
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import Conflict
from fleet.core.models import Operation
from fleet.inventory.models import Gpu, Host
from fleet.inventory.services import host_create
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from fleet.workflows.repack import capacity_repack_apply, repack_advance
from tests.agent_sim import SimAgent
from tests.allocations.test_moves import PROCESS, _report
from tests.factories import GpuFactory, HostFactory, allow_process

pytestmark = pytest.mark.django_db

H100 = "h100-sxm5-80gb"


@pytest.fixture
def world(django_capture_on_commit_callbacks):
    """Three H100s, each with one replica on a 1g.10gb slice: two can be emptied onto the
    third (or onto each other), one replica moved per GPU."""
    host, _ = host_create(name="node")
    host_issue_token(host)
    agent = SimAgent([H100, H100, H100])
    Host.objects.filter(pk=host.pk).update(hostname="sim-0", status="ready")
    agent_hello(host=host, hello=agent.hello())
    gpus = list(Gpu.objects.filter(host=host).order_by("index"))
    for gpu in gpus:
        gpu_set_layout(
            gpu_id=gpu.pk,
            spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("1g.10gb", 0),)),
        )
    small = deployment_create(
        name="small", request=DeploymentRequest(kind="mig", profile="1g.10gb"), replicas=3
    )
    for gpu in gpus:
        deployment_place(deployment_id=small.pk, partition_id=Partition.objects.get(gpu=gpu).pk)

    def sync():
        with django_capture_on_commit_callbacks(execute=True):
            agent_ack(host=host, ack=agent.apply(host_desired_state(Host.objects.get(pk=host.pk))))

    sync()
    return gpus, small, sync


def _run(operation: Operation, sync) -> Operation:
    for _ in range(12):  # the agent applies each change the repack makes
        sync()
        operation.refresh_from_db()
        if operation.status != "dispatched":
            break
    return operation


def test_the_plan_empties_the_gpus_and_the_result_lists_them(
    world, django_capture_on_commit_callbacks
):
    gpus, small, sync = world
    plan = capacity_repack_plan(product_key=H100, count=2)
    assert plan.feasible and plan.cost == 2 and plan.method == "cp-sat"
    with django_capture_on_commit_callbacks(execute=True):
        operation = capacity_repack_apply(product_key=H100, count=2)

    operation = _run(operation, sync)

    assert operation.status == "succeeded", operation.payload
    freed = operation.result["freed_gpus"]
    assert sorted(freed) == sorted(plan.freed)
    assert not Partition.objects.filter(gpu_id__in=freed, kind="mig").exists()
    kept = next(g for g in gpus if g.pk not in freed)
    assert Allocation.objects.filter(deployment=small, gpu=kept).count() == 3
    assert "GPU(s) freed" in operation.reason


def test_at_most_max_unavailable_gpus_are_emptied_at_once(
    world, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        operation = capacity_repack_apply(product_key=H100, count=2, max_unavailable=1)
    operation.refresh_from_db()
    # The first GPU waits for the agent to destroy the slice its replica left.
    assert [g["state"] for g in operation.payload["plan"]] == ["active", "waiting"]


def test_a_second_repack_or_an_impossible_one_is_refused(world):
    capacity_repack_apply(product_key=H100, count=1)
    with pytest.raises(Conflict) as running:
        capacity_repack_apply(product_key=H100, count=1)
    assert running.value.code == "repack.in_progress"
    Operation.objects.filter(kind="repack").update(status="succeeded")
    with pytest.raises(Conflict) as impossible:
        capacity_repack_apply(product_key=H100, count=3)
    assert impossible.value.code == "repack.infeasible"
    assert "fit on the GPUs left" in impossible.value.message


def test_a_failed_move_stops_the_repack_with_its_reason(world, django_capture_on_commit_callbacks):
    _, small, _ = world
    with django_capture_on_commit_callbacks(execute=True):
        operation = capacity_repack_apply(product_key=H100, count=1)
    operation.refresh_from_db()
    failed = Operation.objects.create(kind="move", status="failed", reason="the new copy failed")
    payload = operation.payload
    group = payload["plan"][0]
    group["steps"][0] = {**group["steps"][0], "kind": "move", "move": failed.pk}
    group.update(step="moving", index=0, state="active")
    Operation.objects.filter(pk=operation.pk).update(payload=payload)

    assert repack_advance(operation_id=operation.pk) == "failed"

    operation.refresh_from_db()
    assert operation.status == "failed"
    assert "the move failed" in operation.reason and "keeps running" in operation.reason
    assert operation.result == {"freed_gpus": []}
    assert Allocation.objects.filter(deployment=small).count() == 3


def _dedicated(host, product_key: str):
    gpu = GpuFactory(host=host, product_key=product_key)
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    return gpu


def test_a_whole_gpu_replica_moves_to_a_free_gpu_of_another_product(
    django_capture_on_commit_callbacks,
):
    allow_process()
    host = HostFactory(runtime="process", process_runtime=True)
    h100 = _dedicated(host, H100)
    a100 = _dedicated(host, "a100-sxm4-80gb")
    whole = deployment_create(
        name="trainer",
        request=DeploymentRequest(kind="gpu", gpu_count=1),
        replicas=1,
        workload=PROCESS,
    )
    deployment_place(deployment_id=whole.pk, gpu_id=h100.pk)

    plan = capacity_repack_plan(product_key=H100, count=1)
    assert plan.feasible and [(m.kind, m.to_gpu) for m in plan.moves] == [("gpu", a100.pk)]
    with django_capture_on_commit_callbacks(execute=True):
        operation = capacity_repack_apply(product_key=H100, count=1)
    new = Allocation.objects.get(deployment=whole, replaces__isnull=False)
    assert new.gpu_id == a100.pk  # make before break: the old copy still runs
    with django_capture_on_commit_callbacks(execute=True):
        _report(a100, new.pk, "running")
    operation.refresh_from_db()

    assert operation.status == "succeeded", operation.payload["log"]
    assert operation.result == {"freed_gpus": [h100.pk]}
    assert list(Allocation.objects.filter(deployment=whole).values_list("gpu_id", flat=True)) == [
        a100.pk
    ]


def test_gpus_running_a_multi_gpu_replica_are_not_emptied():
    host = HostFactory()
    first, second = _dedicated(host, H100), _dedicated(host, H100)
    other = HostFactory()  # not beside the H100s: the pair takes both of them
    _dedicated(other, "a100-sxm4-80gb")
    _dedicated(other, "a100-sxm4-80gb")
    pair = deployment_create(
        name="pair", request=DeploymentRequest(kind="gpu", gpu_count=2), replicas=1
    )
    deployment_place(deployment_id=pair.pk, gpu_id=first.pk)

    plan = capacity_repack_plan(product_key=H100, count=1)

    assert not plan.feasible
    assert {g for g, _ in plan.unmovable} == {first.pk, second.pk}
    assert all("spans 2 GPUs" in why for _, why in plan.unmovable)


def test_a_running_repack_is_not_expired_by_the_beat(world, settings):
    """Only operations that wait for an agent's ack (they carry a generation) expire: a repack
    older than the operation timeout keeps running (issue 22, defect 1)."""
    from datetime import timedelta

    from django.utils import timezone

    from fleet.partitioning.delivery import operations_expire

    operation = capacity_repack_apply(product_key=H100, count=1)
    settings.FLEET_OPERATION_TIMEOUT_SECONDS = 0
    expired = operations_expire(timezone.now() + timedelta(hours=1))
    operation.refresh_from_db()
    assert operation.pk not in expired
    assert operation.status in ("pending", "dispatched")


def test_a_failed_repack_raises_an_alert(world, django_capture_on_commit_callbacks):
    """A repack that fails tells the webhooks that subscribe, like every other operation
    (issue 22, defect 2)."""
    from fleet.core import alerts
    from fleet.core.models import AlertDelivery
    from tests.factories import webhook

    webhook("https://hooks.example/", [alerts.OPERATION_FAILED])
    with django_capture_on_commit_callbacks(execute=True):
        operation = capacity_repack_apply(product_key=H100, count=1)
    operation.refresh_from_db()
    payload = operation.payload
    payload["deadline"] = "2000-01-01T00:00:00+00:00"  # past: the repack runs out of time
    Operation.objects.filter(pk=operation.pk).update(payload=payload)
    with django_capture_on_commit_callbacks(execute=True):
        assert repack_advance(operation_id=operation.pk) == "failed"
    operation.refresh_from_db()
    assert operation.status == "failed" and "did not finish in time" in operation.reason
    events = AlertDelivery.objects.filter(event=alerts.OPERATION_FAILED)
    assert [d.payload["subject"]["operation"]["id"] for d in events] == [operation.pk]
