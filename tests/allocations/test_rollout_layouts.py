"""Rollouts with a layout per GPU (the advisor's proposals) and from a mig-parted config; a GPU
whose new layout keeps its busy partitions is reshaped in place."""

from __future__ import annotations

import pytest
import yaml

from fleet.allocations.layout_rollouts import Selector, layout_rollout_start
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import ServiceError
from fleet.core.models import Operation
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec
from tests.allocations.rollout_world import (
    H100,
    SEVEN,
    TWO_3G,
    held,
    run_rollout,
    world_fixture,  # noqa: F401 (the world fixture)
)
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

ADDED = LayoutSpec(
    mode="mig",
    instances=(MigInstanceSpec("3g.40gb", 4), MigInstanceSpec("4g.40gb", 0)),
)


def test_each_gpu_takes_its_own_layout_and_unlisted_gpus_are_left_alone(
    world, django_capture_on_commit_callbacks
):
    _, agent, gpus, sync = world
    with django_capture_on_commit_callbacks(execute=True):
        operation = layout_rollout_start(
            selector=Selector(gpus=(gpus[0].pk, gpus[1].pk)),
            layout={gpus[0].pk: SEVEN, gpus[1].pk: ADDED},
            max_unavailable=2,
        )
    operation = run_rollout(sync, operation)
    assert operation.status == "succeeded", operation.payload
    assert held(agent, gpus[0]) == [(0, 0)]
    assert held(agent, gpus[1]) == [(5, 0), (9, 4)]
    assert held(agent, gpus[2]) == [(9, 0), (9, 4)]


def test_a_layout_for_a_gpu_outside_the_selector_is_refused(world):
    _, _, gpus, _ = world
    before = snapshot_rows()
    with pytest.raises(ServiceError) as refused:
        layout_rollout_start(
            selector=Selector(gpus=(gpus[0].pk,)), layout={gpus[0].pk: SEVEN, gpus[1].pk: SEVEN}
        )
    assert refused.value.code == "rollout.gpu_not_selected"
    assert refused.value.details["gpus"] == [gpus[1].pk]
    assert snapshot_rows() == before


def test_a_busy_gpu_whose_replica_keeps_its_partition_is_reshaped_in_place(
    world, django_capture_on_commit_callbacks
):
    _, agent, gpus, sync = world
    deployment = deployment_create(
        name="chat", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    kept = Partition.objects.get(gpu=gpus[0], start=4)
    with django_capture_on_commit_callbacks(execute=True):
        deployment_place(deployment_id=deployment.pk, partition_id=kept.pk)
    sync()
    with django_capture_on_commit_callbacks(execute=True):
        operation = layout_rollout_start(
            selector=Selector(gpus=(gpus[0].pk,)), layout={gpus[0].pk: ADDED}
        )
    operation.refresh_from_db()
    assert "in place" in operation.payload["log"][-1]["note"]
    operation = run_rollout(sync, operation)
    assert operation.status == "succeeded", operation.payload
    assert held(agent, gpus[0]) == [(5, 0), (9, 4)]
    allocation = deployment.allocations.get()
    assert allocation.partition_id == kept.pk  # never moved, never stopped
    assert not Operation.objects.filter(kind="drain").exists()


MIGPARTED = """
version: v1
mig-configs:
  all-7g:
    - devices: all
      mig-enabled: true
      mig-devices: {"7g.80gb": 1}
  split:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"7g.80gb": 1}
    - devices: [1, 2]
      device-filter: ["0x233010DE"]
      mig-enabled: true
      mig-devices: {"4g.40gb": 1, "3g.40gb": 1}
  overlapping:
    - devices: all
      mig-enabled: true
      mig-devices: {"7g.80gb": 1}
    - devices: [1]
      mig-enabled: true
      mig-devices: {"7g.80gb": 1}
  too-big:
    - devices: all
      mig-enabled: true
      mig-devices: {"7g.80gb": 2}
"""


def _migparted(name, config=MIGPARTED, **extra):
    return {"selector": {"product": H100}, "migparted": {"config": config, "name": name}, **extra}


def test_a_migparted_config_is_the_layout_of_each_gpu(
    world, operator_client, django_capture_on_commit_callbacks
):
    _, agent, gpus, sync = world
    with django_capture_on_commit_callbacks(execute=True):
        started = operator_client.post(
            "/api/v1/rollouts/", _migparted("split", max_unavailable=3), format="json"
        )
    assert started.status_code == 202, started.json()
    operation = run_rollout(sync, Operation.objects.get(pk=started.json()["id"]))
    assert operation.status == "succeeded", operation.payload
    assert held(agent, gpus[0]) == [(0, 0)]
    # GPUs 1 and 2 already hold 2 x 3g; the entry asks 4g + 3g: 4g at 0, 3g at 4.
    assert held(agent, gpus[1]) == [(5, 0), (9, 4)] == held(agent, gpus[2])


def test_a_migparted_dry_run_answers_like_a_layout_dry_run_and_changes_nothing(
    world, operator_client
):
    before = snapshot_rows()
    dry = operator_client.post(
        "/api/v1/rollouts/", _migparted("all-7g", dry_run=True), format="json"
    )
    assert dry.status_code == 200, dry.json()
    assert len(dry.json()["gpus"]) == 3 and dry.json()["problems"] == []
    as_object = yaml.safe_load(MIGPARTED)
    dry = operator_client.post(
        "/api/v1/rollouts/", _migparted("all-7g", as_object, dry_run=True), format="json"
    )
    assert dry.status_code == 200 and len(dry.json()["gpus"]) == 3
    assert snapshot_rows() == before


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (_migparted("all-7g", "version: v2\nmig-configs: {}"), "rollout.migparted_invalid"),
        (_migparted("all-7g", "{not yaml"), "rollout.migparted_invalid"),
        (_migparted("nope"), "rollout.migparted_unknown_config"),
        (_migparted("overlapping"), "rollout.migparted_ambiguous"),
        (_migparted("too-big"), "rollout.migparted_invalid"),
        (_migparted("all-7g", 42), None),
        ({**_migparted("all-7g"), "layout": SEVEN.as_json()}, None),
    ],
)
def test_bad_migparted_rollouts_are_refused_and_create_nothing(world, operator_client, body, code):
    before = snapshot_rows()
    assert_error(operator_client.post("/api/v1/rollouts/", body, format="json"), 400, code)
    assert not Operation.objects.filter(kind="layout_rollout").exists()
    assert snapshot_rows() == before


def test_a_gpu_no_migparted_entry_selects_is_refused(world, operator_client):
    config = MIGPARTED.replace("devices: [1, 2]", "devices: [1]")
    body = _migparted("split", config)
    error = assert_error(
        operator_client.post("/api/v1/rollouts/", body, format="json"),
        400,
        "rollout.migparted_no_entry",
    )
    assert error["details"]["index"] == 2


def test_a_per_gpu_dry_run_lists_only_the_gpus_that_change(world, operator_client):
    _, _, gpus, _ = world
    before = snapshot_rows()
    body = {
        "selector": {"product": H100},
        "layouts": [
            {"gpu": gpus[0].pk, "layout": SEVEN.as_json()},
            {"gpu": gpus[1].pk, "layout": TWO_3G.as_json()},  # already so
        ],
        "dry_run": True,
    }
    dry = operator_client.post("/api/v1/rollouts/", body, format="json")
    assert dry.status_code == 200, dry.json()
    assert [g["gpu"] for g in dry.json()["gpus"]] == [gpus[0].pk]
    twice = {**body, "layouts": [body["layouts"][0], body["layouts"][0]]}
    assert_error(operator_client.post("/api/v1/rollouts/", twice, format="json"), 400)
    assert snapshot_rows() == before
