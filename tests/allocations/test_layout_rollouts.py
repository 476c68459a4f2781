"""Fleet-wide layout rollouts: waves of drain-and-reshape over the GPUs a selector picks; the
first failure pauses, resume tries that GPU again, abort stops starting new ones."""

from __future__ import annotations

import pytest

from fleet.allocations.layout_rollouts import (
    Selector,
    layout_rollout_abort,
    layout_rollout_resume,
    layout_rollout_start,
)
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import Conflict, ServiceError
from fleet.core.models import Operation
from fleet.inventory.models import Gpu
from fleet.partitioning.models import Partition
from fleet.workflows.layout_rollouts import layout_rollout_advance
from tests.allocations.rollout_world import (
    H100,
    SEVEN,
    held,
    run_rollout,
    world_fixture,  # noqa: F401 (the world fixture)
)
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db


def test_every_selected_gpu_is_reshaped_in_waves(world, django_capture_on_commit_callbacks):
    _, agent, gpus, sync = world
    with django_capture_on_commit_callbacks(execute=True):
        operation = layout_rollout_start(
            selector=Selector(product=H100, labels={"pool": "a"}), layout=SEVEN, max_unavailable=2
        )
    operation.refresh_from_db()
    assert len(operation.payload["draining"]) == 2 and len(operation.payload["pending"]) == 1
    operation = run_rollout(sync, operation)
    assert operation.status == "succeeded", operation.payload
    assert sorted(operation.payload["done"]) == sorted(g.pk for g in gpus)
    assert all(held(agent, gpu) == [(0, 0)] for gpu in gpus)
    assert not any(Gpu.objects.get(pk=g.pk).cordoned for g in gpus)
    # Run again: every GPU already has the layout.
    with pytest.raises(Conflict) as again:
        layout_rollout_start(selector=Selector(product=H100), layout=SEVEN)
    assert again.value.code == "rollout.nothing_to_do"


def test_a_busy_gpu_pauses_the_rollout_and_resume_finishes_it(
    world, django_capture_on_commit_callbacks
):
    _, agent, gpus, sync = world
    # A process Fleet does not know about keeps the second GPU's 3g at slice 4 busy.
    instance = next(i for i in agent.backend.mig_instances(gpus[1].uuid) if i.start == 4)
    pid = agent.backend.run_process(gpus[1].uuid, 512, gpu_instance_id=instance.gpu_instance_id)
    with django_capture_on_commit_callbacks(execute=True):
        operation = layout_rollout_start(selector=Selector(product=H100), layout=SEVEN)
    operation = run_rollout(sync, operation)
    assert operation.payload["paused"] and f"GPU {gpus[1].pk}" in operation.payload["paused"]
    assert held(agent, gpus[0]) == [(0, 0)]  # the first wave went through
    assert held(agent, gpus[2]) == [(9, 0), (9, 4)]  # nothing started after the failure
    assert held(agent, gpus[1]) == [(9, 0), (9, 4)]  # the failed GPU was rolled back
    assert layout_rollout_advance(operation_id=operation.pk) == "wait"  # stays paused
    agent.backend.kill_process(pid if isinstance(pid, int) else pid.pid)
    with django_capture_on_commit_callbacks(execute=True):
        layout_rollout_resume(operation_id=operation.pk)
    operation = run_rollout(sync, operation)
    assert operation.status == "succeeded", operation.payload
    assert all(held(agent, gpu) == [(0, 0)] for gpu in gpus)


def test_abort_starts_no_new_drain(world, django_capture_on_commit_callbacks):
    _, agent, gpus, sync = world
    with django_capture_on_commit_callbacks(execute=True):
        operation = layout_rollout_start(selector=Selector(product=H100), layout=SEVEN)
    operation.refresh_from_db()
    assert list(operation.payload["draining"]) == [str(gpus[0].pk)]  # the first wave started
    with django_capture_on_commit_callbacks(execute=True):
        layout_rollout_abort(operation_id=operation.pk)
    operation = run_rollout(sync, operation)
    assert operation.status == "failed" and "aborted" in operation.reason
    assert held(agent, gpus[0]) == [(0, 0)]  # the drain under way finished
    assert held(agent, gpus[2]) == [(9, 0), (9, 4)]
    with pytest.raises(Conflict):
        layout_rollout_resume(operation_id=operation.pk)


def test_a_dry_run_lists_gpus_and_replicas_and_changes_nothing(world):
    _, _, gpus, _ = world
    deployment = deployment_create(
        name="chat", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    deployment_place(
        deployment_id=deployment.pk, partition_id=Partition.objects.get(gpu=gpus[0], start=0).pk
    )
    before = snapshot_rows()
    answer = layout_rollout_start(selector=Selector(gpus=(gpus[0].pk,)), layout=SEVEN, dry_run=True)
    assert isinstance(answer, dict)
    assert [g["gpu"] for g in answer["gpus"]] == [gpus[0].pk]
    (replica,) = answer["gpus"][0]["replicas"]
    assert replica["replica"] == "chat[0]" and replica["has_room_elsewhere"] is True
    assert answer["replicas_to_move"] == 1 and answer["replicas_without_room"] == 0
    assert snapshot_rows() == before


def test_bad_rollouts_are_refused(world, operator_client, viewer_client):
    body = {"selector": {"product": H100}, "layout": SEVEN.as_json()}
    assert_error(viewer_client.post("/api/v1/rollouts/", body, format="json"), 403)
    assert_error(
        operator_client.post("/api/v1/rollouts/", {**body, "selector": {}}, format="json"),
        400,
        "rollout.selector_required",
    )
    bad = {"mode": "mig", "instances": [{"profile": "7g.80gb", "start": 3}]}
    assert_error(
        operator_client.post("/api/v1/rollouts/", {**body, "layout": bad}, format="json"),
        400,
        "rollout.layout_invalid",
    )
    assert_error(
        operator_client.post("/api/v1/rollouts/", {**body, "max_unavailable": 0}, format="json"),
        400,
    )
    assert not Operation.objects.filter(kind="layout_rollout").exists()
    with pytest.raises(ServiceError):
        layout_rollout_start(selector=Selector(), layout=SEVEN)


def test_the_api_starts_lists_and_shows_a_rollout(world, operator_client, viewer_client):
    body = {"selector": {"product": H100}, "layout": SEVEN.as_json(), "max_unavailable": 1}
    dry = operator_client.post("/api/v1/rollouts/", {**body, "dry_run": True}, format="json")
    assert dry.status_code == 200 and len(dry.json()["gpus"]) == 3
    started = operator_client.post("/api/v1/rollouts/", body, format="json")
    assert started.status_code == 202, started.json()
    rollout_id = started.json()["id"]
    listed = viewer_client.get("/api/v1/rollouts/").json()
    assert [r["id"] for r in listed] == [rollout_id]
    assert viewer_client.get(f"/api/v1/rollouts/{rollout_id}/").json()["kind"] == "layout_rollout"
    assert_error(viewer_client.post(f"/api/v1/rollouts/{rollout_id}/abort"), 403)
    assert_error(
        operator_client.post(f"/api/v1/rollouts/{rollout_id}/resume"), 409, "rollout.not_paused"
    )
    assert operator_client.post(f"/api/v1/rollouts/{rollout_id}/abort").status_code == 200


def test_a_failure_in_the_work_after_commit_never_fails_the_request(
    world, operator_client, django_capture_on_commit_callbacks, monkeypatch, caplog
):
    """The rollout is created; its first drains' advance (run after commit) hits a deadlock:
    that is logged and beat advances the drain later, the request still answers 202."""
    from dataclasses import replace

    from django.db import OperationalError

    from fleet.workflows.registry import BY_KIND

    def deadlock(**_: object) -> str:
        raise OperationalError("deadlock detected")

    monkeypatch.setitem(BY_KIND, "drain", replace(BY_KIND["drain"], advance=deadlock))
    body = {"selector": {"product": H100}, "layout": SEVEN.as_json(), "max_unavailable": 2}
    with django_capture_on_commit_callbacks(execute=True):
        started = operator_client.post("/api/v1/rollouts/", body, format="json")
    assert started.status_code == 202, started.json()
    operation = Operation.objects.get(pk=started.json()["id"])
    assert len(operation.payload["draining"]) == 2
    assert "deadlock detected" in caplog.text


def test_replicas_leaving_a_gpu_avoid_the_gpus_the_rollout_drains_later(
    world, django_capture_on_commit_callbacks
):
    """The engine would pack the first GPU's replica beside the second GPU's (fragmenting
    least); the second is drained next, so the replica goes to the third, which the rollout
    leaves alone, and moves once."""
    _, _, gpus, sync = world
    for name, gpu in (("leaving", gpus[0]), ("staying", gpus[1])):
        deployment = deployment_create(
            name=name, request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
        )
        deployment_place(
            deployment_id=deployment.pk,
            partition_id=Partition.objects.get(gpu=gpu, start=0).pk,
        )
    sync()
    selector = Selector(product=H100, gpus=(gpus[0].pk, gpus[1].pk))
    with django_capture_on_commit_callbacks(execute=True):
        operation = layout_rollout_start(selector=selector, layout=SEVEN, max_unavailable=1)
    sync()
    drain = Operation.objects.get(kind="drain", gpu=gpus[0])
    assert drain.payload["avoid_gpus"] == [gpus[1].pk]
    moved = Operation.objects.get(kind="move", deployment__name="leaving")
    assert moved.payload["to_gpu"] == gpus[2].pk, moved.payload
    operation = run_rollout(sync, operation)
    assert operation.status == "succeeded", operation.payload
    assert Operation.objects.filter(kind="move", deployment__name="leaving").count() == 1


def test_turning_on_mps_inside_the_existing_instances_is_a_change_to_roll_out(world):
    """Issue 22, defect 4: the advice that only turns on MPS inside existing MIG instances
    could not be applied (the comparison looked at profiles and starts only)."""
    from fleet.mps.values import MpsPolicy
    from fleet.partitioning.services import LayoutSpec, MigInstanceSpec
    from tests.allocations.rollout_world import TWO_3G

    with_mps = LayoutSpec(
        mode="mig",
        instances=tuple(
            MigInstanceSpec(i.profile, i.start, MpsPolicy() if n == 0 else None)
            for n, i in enumerate(TWO_3G.instances)
        ),
    )
    plan = layout_rollout_start(selector=Selector(product=H100), layout=with_mps, dry_run=True)
    assert len(plan["gpus"]) == 3 and not plan["problems"]
    with pytest.raises(Conflict) as same:  # the same layout, MPS included, is nothing to do
        layout_rollout_start(selector=Selector(product=H100), layout=TWO_3G)
    assert same.value.code == "rollout.nothing_to_do"
