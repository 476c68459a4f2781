"""Defragmentation that applies: the planner's moves carried out (make before break), the slices
they leave destroyed, then the waiting replica placed."""

from __future__ import annotations

import pytest

from fleet.agents.delivery import agent_ack
from fleet.agents.discovery import agent_hello
from fleet.agents.documents import host_desired_state
from fleet.agents.enrollment import host_issue_token
from fleet.allocations.models import Allocation
from fleet.allocations.rankings import deployment_defrag_plan
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import Conflict
from fleet.core.models import Operation
from fleet.inventory.models import Gpu, Host
from fleet.inventory.services import host_create
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from fleet.workflows.defrag import defrag_advance, deployment_defrag_apply
from tests.agent_sim import SimAgent
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(django_capture_on_commit_callbacks):
    """Two H100s, each with a small replica on a 1g.10gb slice; a 4g.40gb fits on neither
    until one of them moves (the other GPU has room for it)."""
    host, _ = host_create(name="node")
    host_issue_token(host)
    agent = SimAgent(["h100-sxm5-80gb", "h100-sxm5-80gb"])
    Host.objects.filter(pk=host.pk).update(hostname="sim-0", status="ready")
    agent_hello(host=host, hello=agent.hello())
    first, second = Gpu.objects.filter(host=host).order_by("index")
    for gpu, start in ((first, 0), (second, 0)):
        gpu_set_layout(
            gpu_id=gpu.pk,
            spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("1g.10gb", start),)),
        )
    small = deployment_create(
        name="small", request=DeploymentRequest(kind="mig", profile="1g.10gb"), replicas=2
    )
    for gpu in (first, second):
        deployment_place(deployment_id=small.pk, partition_id=Partition.objects.get(gpu=gpu).pk)
    big = deployment_create(
        name="big", request=DeploymentRequest(kind="mig", profile="4g.40gb"), replicas=1
    )

    def sync():
        with django_capture_on_commit_callbacks(execute=True):
            agent_ack(host=host, ack=agent.apply(host_desired_state(Host.objects.get(pk=host.pk))))

    sync()
    return host, agent, small, big, sync


def test_the_plan_is_applied_and_the_waiting_replica_placed(
    world, django_capture_on_commit_callbacks
):
    _, agent, small, big, sync = world
    plan = deployment_defrag_plan(big)
    assert plan.target is not None and plan.moves  # it fits only after a move
    with django_capture_on_commit_callbacks(execute=True):
        operation = deployment_defrag_apply(deployment_id=big.pk)
    # The GPUs it touches, which reclaims keep away from while it runs.
    touched = {plan.target.gpu_id} | {m.from_gpu for m in plan.moves}
    touched |= {m.to_gpu for m in plan.moves if m.to_gpu is not None}
    assert operation.payload["gpus"] == sorted(touched) and len(touched) == 2
    for _ in range(6):  # the agent applies each change the defrag makes
        sync()
        operation.refresh_from_db()
        if operation.status != "dispatched":
            break
    assert operation.status == "succeeded", operation.payload
    placed = Allocation.objects.get(deployment=big)
    assert placed.partition.profile_name == "4g.40gb"
    assert Allocation.objects.filter(deployment=small).count() == 2  # both still placed
    notes = [entry["note"] for entry in operation.payload["log"]]
    assert any("moving allocation" in n for n in notes) and any("destroying" in n for n in notes)
    # Once the agent has applied the placement, it holds the layout Fleet wants: nothing left.
    sync()
    for gpu in Gpu.objects.filter(host=world[0]):
        wanted = sorted(
            (p.profile_id, p.start) for p in Partition.objects.filter(gpu=gpu, kind="mig")
        )
        held = sorted((i.profile_id, i.start) for i in agent.backend.mig_instances(gpu.uuid))
        assert held == wanted


def test_a_replica_that_fits_now_or_has_no_plan_is_refused_and_changes_nothing(world):
    _, _, small, _, _ = world
    with pytest.raises(Conflict) as full:
        deployment_defrag_apply(deployment_id=small.pk)
    assert full.value.code == "deployment.fully_placed"
    huge = deployment_create(
        name="huge", request=DeploymentRequest(kind="gpu", gpu_count=3), replicas=1
    )
    with pytest.raises(Conflict) as none:
        deployment_defrag_apply(deployment_id=huge.pk)
    assert none.value.code == "defrag.no_plan"
    tiny = deployment_create(
        name="tiny", request=DeploymentRequest(kind="mig", profile="1g.10gb"), replicas=1
    )
    with pytest.raises(Conflict) as fits:
        deployment_defrag_apply(deployment_id=tiny.pk)
    assert fits.value.code == "defrag.fits_now"
    assert not Operation.objects.filter(kind__in=["defrag", "move"]).exists()


def test_the_api_applies_for_operators_only(world, operator_client, viewer_client):
    _, _, _, big, _ = world
    url = f"/api/v1/deployments/{big.pk}/defrag"
    assert_error(viewer_client.post(url, {}, format="json"), 403)
    response = operator_client.post(url, {}, format="json")
    assert response.status_code == 202, response.json()
    assert response.json()["kind"] == "defrag"
    assert_error(operator_client.post(url, {}, format="json"), 409, "defrag.in_progress")
    assert operator_client.get(url).status_code == 200  # the proposal still reads


def test_a_failed_move_stops_the_defrag_with_its_reason(world, django_capture_on_commit_callbacks):
    _, _, _, big, _ = world
    with django_capture_on_commit_callbacks(execute=True):
        operation = deployment_defrag_apply(deployment_id=big.pk)
    operation.refresh_from_db()
    assert operation.status == "dispatched"  # waiting for the agent to destroy the left slice
    # Say its move had failed instead (its new copy crashed): the defrag stops there.
    failed = Operation.objects.create(kind="move", status="failed", reason="the new copy failed")
    payload = operation.payload
    payload["plan"][0] = {**payload["plan"][0], "kind": "move", "move": failed.pk}
    Operation.objects.filter(pk=operation.pk).update(
        payload={**payload, "step": "moving", "index": 0}
    )
    assert defrag_advance(operation_id=operation.pk) == "failed"
    operation.refresh_from_db()
    assert operation.status == "failed"
    assert "the move failed" in operation.reason and "keeps running" in operation.reason
    assert not Allocation.objects.filter(deployment=big).exists()
