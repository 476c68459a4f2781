"""What replicas run: the workload in a deployment, its reported state, and the slice a stopping
workload keeps until the agent says it has exited."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleet.agents.documents import host_desired_state
from fleet.agents.messages import handle_message
from fleet.allocations.models import Allocation, AllocationState, Deployment
from fleet.allocations.services import (
    DeploymentRequest,
    deployment_create,
    deployment_delete,
    deployment_evict,
    deployment_place,
)
from fleet.allocations.workloads import workloads_record
from fleet.core.errors import Conflict
from fleet.inventory.models import Host
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory, dedicated_gpus
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

CONTAINER = {
    "runtime": "container",
    "image": "registry.example/llm:1.2",
    "command": ["serve", "--port", "8000"],
    "env": {"MODEL": "qwen-7b"},
    "stop_grace_s": 30,
    "health": {"http": {"port": 8000, "path": "/health"}},
}


@pytest.fixture
def mig_gpu():
    host = HostFactory(runtime="docker")
    gpu = GpuFactory(host=host, product_key="h100-sxm5-80gb")
    gpu_set_layout(
        gpu_id=gpu.pk,
        spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec(profile="3g.40gb", start=4),)),
    )
    return gpu


def _placed(gpu, name="llm", workload: dict[str, Any] | None = CONTAINER) -> Allocation:
    deployment = deployment_create(
        name=name,
        request=DeploymentRequest(kind="mig", profile="3g.40gb"),
        replicas=1,
        workload=workload,
    )
    partition = Partition.objects.get(gpu=gpu, profile_name="3g.40gb")
    deployment_place(deployment_id=deployment.pk, partition_id=partition.pk)
    return Allocation.objects.get(deployment=deployment)


def _status(allocation_id: int, state: str, **extra: Any) -> dict[str, Any]:
    return {
        "allocation_id": allocation_id,
        "state": state,
        "started_at": extra.get("started_at"),
        "exit_code": extra.get("exit_code"),
        "restarts": extra.get("restarts", 0),
        "message": extra.get("message", ""),
        "pids": [],
    }


# -- the workload in a deployment -------------------------------------------------------------


def test_a_deployment_keeps_its_workload_with_every_default_filled(operator_client):
    response = operator_client.post(
        "/api/v1/deployments/",
        {"name": "llm", "kind": "mig", "profile": "3g.40gb", "workload": CONTAINER},
        format="json",
    )
    assert response.status_code == 201, response.json()
    workload = response.json()["workload"]
    assert workload["image"] == "registry.example/llm:1.2"
    assert workload["restart"] == "always" and workload["user"] is None
    assert workload["health"] == {
        "http": {"port": 8000, "path": "/health"},
        "interval_s": 10,
        "timeout_s": 3,
        "retries": 3,
        "start_period_s": 0,
    }
    # What is stored is the workload; the answer adds whether the reader saw all of it.
    assert workload.pop("redacted") is False
    assert Deployment.objects.get(name="llm").workload == workload


def test_without_a_workload_a_deployment_runs_nothing(operator_client):
    response = operator_client.post(
        "/api/v1/deployments/", {"name": "r", "kind": "mig", "profile": "1g.10gb"}, format="json"
    )
    assert response.status_code == 201
    assert response.json()["workload"]["runtime"] == "none"
    assert response.json()["running_replicas"] == 0


@pytest.mark.parametrize(
    "workload",
    [
        {"runtime": "container"},
        {"runtime": "container", "image": "Bad Image"},
        {"runtime": "process"},
        {"runtime": "process", "command": ["x"], "env": {"CUDA_VISIBLE_DEVICES": "0"}},
        {"runtime": "process", "command": ["x"], "env": {f"V{i}": "1" for i in range(65)}},
        {"runtime": "process", "command": ["x"], "env": {"1X": "1"}},
        {"runtime": "process", "command": ["x"], "imge": "typo"},
        {"runtime": "process", "command": ["x"], "stop_grace_s": -1},
        {"runtime": "process", "command": ["x"], "stop_grace_s": 10**9},
        {"runtime": "process", "command": ["x"], "restart": "sometimes"},
        {"runtime": "process", "command": ["x"], "cwd": "relative/dir"},
        {"runtime": "process", "command": ["x"], "health": {}},
        {
            "runtime": "process",
            "command": ["x"],
            "health": {"tcp": {"port": 1}, "http": {"port": 2}},
        },
        {"runtime": "process", "command": ["x"], "health": {"tcp": {"port": 70000}}},
        {"runtime": "none", "command": ["x"]},
        {"runtime": "docker"},
    ],
)
def test_an_invalid_workload_is_refused_and_changes_nothing(operator_client, workload):
    body = {"name": "bad", "kind": "mig", "profile": "1g.10gb", "workload": workload}
    response = operator_client.post("/api/v1/deployments/", body, format="json")
    error = assert_error(response, 400)
    assert error["code"] in ("invalid", "workload.invalid"), error
    assert not Deployment.objects.exists()


# -- the desired state carries it ---------------------------------------------------------------


def test_the_desired_state_carries_each_replicas_workload(mig_gpu):
    allocation = _placed(mig_gpu)
    document = host_desired_state(Host.objects.get(pk=mig_gpu.host_id))
    (entry,) = document["gpus"][mig_gpu.uuid]["allocations"]
    assert entry["allocation_id"] == allocation.pk
    assert entry["deployment"] == "llm" and entry["replica"] == 0
    assert entry["workload"]["image"] == "registry.example/llm:1.2"


# -- reports --------------------------------------------------------------------------------------


def test_the_agent_reports_land_on_its_own_replicas_only(mig_gpu):
    allocation = _placed(mig_gpu)
    other_host = HostFactory(runtime="docker")
    now = time.time()
    handle_message(
        mig_gpu.host_id,
        {
            "type": "workloads",
            "ts": now,
            "full": False,
            "workloads": [_status(allocation.pk, "running", started_at=now, restarts=2)],
        },
    )
    allocation.refresh_from_db()
    assert allocation.workload_state == "running" and allocation.restarts == 2
    assert allocation.started_at is not None
    # Another host's agent cannot touch it.
    workloads_record(host_id=other_host.pk, statuses=[_status(allocation.pk, "failed")], full=False)
    allocation.refresh_from_db()
    assert allocation.workload_state == "running"


def test_the_api_shows_the_replicas_workload_state(mig_gpu, viewer_client):
    allocation = _placed(mig_gpu)
    workloads_record(
        host_id=mig_gpu.host_id,
        statuses=[_status(allocation.pk, "crashloop", exit_code=3, restarts=5, message="exit 3")],
        full=False,
    )
    body = viewer_client.get(f"/api/v1/allocations/{allocation.pk}/").json()
    assert body["workload_state"] == "crashloop"
    assert (body["exit_code"], body["restarts"], body["message"]) == (3, 5, "exit 3")


# -- a stopping workload keeps its slice ----------------------------------------------------------


def test_an_evicted_replica_keeps_its_slice_until_its_workload_has_stopped(mig_gpu):
    allocation = _placed(mig_gpu)
    workloads_record(
        host_id=mig_gpu.host_id, statuses=[_status(allocation.pk, "running")], full=False
    )
    deployment_evict(deployment_id=allocation.deployment_id)
    allocation.refresh_from_db()
    assert allocation.state == AllocationState.RELEASING
    # It is not in the desired state any more (the agent stops it)...
    document = host_desired_state(Host.objects.get(pk=mig_gpu.host_id))
    assert document["gpus"][mig_gpu.uuid]["allocations"] == []
    # ...but nothing else can take its slice meanwhile.
    other = deployment_create(
        name="next", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    with pytest.raises(Exception) as refused:
        deployment_place(deployment_id=other.pk, partition_id=allocation.partition_id)
    assert getattr(refused.value, "status_code", None) in (409, 422)
    # The agent says it stopped: the slice is free.
    workloads_record(
        host_id=mig_gpu.host_id, statuses=[_status(allocation.pk, "stopping")], full=False
    )
    assert Allocation.objects.filter(pk=allocation.pk).exists()
    workloads_record(
        host_id=mig_gpu.host_id, statuses=[_status(allocation.pk, "none", exit_code=0)], full=False
    )
    assert not Allocation.objects.filter(pk=allocation.pk).exists()
    deployment_place(deployment_id=other.pk, partition_id=allocation.partition_id)


def test_a_full_report_that_omits_a_releasing_replica_releases_it(mig_gpu):
    allocation = _placed(mig_gpu)
    workloads_record(
        host_id=mig_gpu.host_id, statuses=[_status(allocation.pk, "running")], full=False
    )
    deployment_evict(deployment_id=allocation.deployment_id)
    workloads_record(host_id=mig_gpu.host_id, statuses=[], full=True)
    assert not Allocation.objects.filter(pk=allocation.pk).exists()


@pytest.mark.parametrize(
    ("workload", "host_runtime", "state"),
    [(None, "docker", "none"), (CONTAINER, "none", "running"), (CONTAINER, "docker", "failed")],
)
def test_a_replica_that_cannot_be_running_frees_its_slice_at_once(
    mig_gpu, workload, host_runtime, state
):
    allocation = _placed(mig_gpu, workload=workload)
    # The agent came back with another runtime (a container cannot be placed on a "none" host).
    Host.objects.filter(pk=mig_gpu.host_id).update(runtime=host_runtime)
    Allocation.objects.filter(pk=allocation.pk).update(workload_state=state)
    deployment_evict(deployment_id=allocation.deployment_id)
    assert not Allocation.objects.filter(pk=allocation.pk).exists()


def test_a_replica_can_be_placed_again_while_its_old_workload_stops(mig_gpu):
    allocation = _placed(mig_gpu)
    workloads_record(
        host_id=mig_gpu.host_id, statuses=[_status(allocation.pk, "running")], full=False
    )
    gpu_set_layout(
        gpu_id=mig_gpu.pk,
        spec=LayoutSpec(
            mode="mig",
            instances=(
                MigInstanceSpec(profile="3g.40gb", start=4),
                MigInstanceSpec(profile="3g.40gb", start=0),
            ),
        ),
    )
    deployment_evict(deployment_id=allocation.deployment_id)
    free = Partition.objects.get(gpu=mig_gpu, start=0)
    deployment_place(deployment_id=allocation.deployment_id, partition_id=free.pk)
    rows = Allocation.objects.filter(deployment_id=allocation.deployment_id)
    assert sorted(rows.values_list("replica", "state")) == [
        (0, AllocationState.PENDING),
        (0, AllocationState.RELEASING),
    ]


# -- a replica of several whole GPUs runs one workload that sees them all ------------------------


@pytest.fixture
def pair():
    """A replica of 2 whole GPUs running a container, on a host of 2 dedicated H100s."""
    host = HostFactory(runtime="docker")
    gpus = dedicated_gpus(host, 2)
    deployment = deployment_create(
        name="train",
        request=DeploymentRequest(kind="gpu", gpu_count=2),
        replicas=1,
        workload=CONTAINER,
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=gpus[0].pk)
    first, second = Allocation.objects.filter(deployment=deployment).order_by("gpu_slot")
    return host, first, second


def test_a_replica_of_two_gpus_is_one_workload_that_sees_both(pair):
    host, first, second = pair
    desired = [
        a
        for gpu in host_desired_state(Host.objects.get(pk=host.pk))["gpus"].values()
        for a in gpu["allocations"]
    ]
    runs = [a for a in desired if a["workload"]["runtime"] != "none"]
    assert [a["allocation_id"] for a in runs] == [first.pk]
    assert runs[0]["devices"] == [first.gpu.uuid, second.gpu.uuid]
    assert runs[0]["workload"]["image"] == CONTAINER["image"]
    (follower,) = (a for a in desired if a["allocation_id"] == second.pk)
    assert "devices" not in follower


def test_each_allocation_of_a_replica_of_two_gpus_names_both_for_a_launcher(pair, viewer_client):
    _, first, second = pair
    both = f"{first.gpu.uuid},{second.gpu.uuid}"
    for allocation in (first, second):
        body = viewer_client.get(f"/api/v1/allocations/{allocation.pk}/").json()
        assert body["environment"]["CUDA_VISIBLE_DEVICES"] == both


def test_the_other_gpus_of_a_replica_take_its_state_and_are_freed_with_it(pair):
    host, first, second = pair
    workloads_record(host_id=host.pk, statuses=[_status(first.pk, "running")], full=False)
    assert set(
        Allocation.objects.filter(pk__in=[first.pk, second.pk]).values_list(
            "workload_state", flat=True
        )
    ) == {"running"}
    # What the agent says of the follower (it runs nothing there) does not count.
    workloads_record(host_id=host.pk, statuses=[_status(second.pk, "none")], full=False)
    assert Allocation.objects.get(pk=second.pk).workload_state == "running"

    deployment_evict(deployment_id=first.deployment_id)
    stopping = _status(first.pk, "stopping")
    workloads_record(host_id=host.pk, statuses=[stopping], full=True)
    assert Allocation.objects.filter(pk__in=[first.pk, second.pk], state="releasing").count() == 2
    workloads_record(host_id=host.pk, statuses=[], full=True)  # its workload has stopped
    assert not Allocation.objects.filter(pk__in=[first.pk, second.pk]).exists()


def test_a_deleted_deployment_waits_for_its_workloads_and_keeps_its_name(
    mig_gpu, django_capture_on_commit_callbacks
):
    allocation = _placed(mig_gpu)
    workloads_record(
        host_id=mig_gpu.host_id, statuses=[_status(allocation.pk, "running")], full=False
    )
    deployment_delete(deployment_id=allocation.deployment_id)
    deployment = Deployment.objects.get(pk=allocation.deployment_id)
    assert deployment.deleting
    with pytest.raises(Conflict) as taken:
        deployment_create(
            name="llm", request=DeploymentRequest(kind="mps", memory_mib=1), replicas=1
        )
    assert taken.value.code == "deployment.deleting"
    with pytest.raises(Conflict):
        deployment_delete(deployment_id=deployment.pk)
    with django_capture_on_commit_callbacks(execute=True):
        workloads_record(
            host_id=mig_gpu.host_id, statuses=[_status(allocation.pk, "none")], full=False
        )
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    deployment_create(name="llm", request=DeploymentRequest(kind="mps", memory_mib=1), replicas=1)


def test_a_hello_records_the_agents_runtime_and_a_none_runtime_releases_what_waited(mig_gpu):
    allocation = _placed(mig_gpu)
    workloads_record(
        host_id=mig_gpu.host_id, statuses=[_status(allocation.pk, "running")], full=False
    )
    deployment_evict(deployment_id=allocation.deployment_id)
    host = Host.objects.get(pk=mig_gpu.host_id)
    hello = {
        "type": "hello",
        "protocol": 1,
        "agent_version": "t",
        "hostname": host.hostname or "h",
        "backend": "simulated",
        "allow_mutation": True,
        "driver_version": None,
        "nvml_version": None,
        "applied_generation": 0,
        "gpus": [],
        "runtime": "none",
    }
    handle_message(host.pk, hello)  # type: ignore[arg-type]
    host.refresh_from_db()
    assert host.runtime == "none"
    assert not Allocation.objects.filter(pk=allocation.pk).exists()


@pytest.mark.parametrize("kind", ["crashloop", "orphan_stopped"])
def test_workload_events_are_recorded_for_the_host_and_touch_no_gpu_health(mig_gpu, kind):
    from fleet.agents.reports import agent_event
    from fleet.inventory.models import Gpu, HealthEvent

    row = agent_event(
        host=Host.objects.get(pk=mig_gpu.host_id),
        event={
            "type": "event",
            "kind": kind,
            "gpu_uuid": mig_gpu.uuid,
            "gpu_instance_id": None,
            "xid": None,
            "detail": "llm[0] failed 5 times in 10 minutes",
            "ts": time.time(),
        },
    )
    assert row is not None and HealthEvent.objects.filter(kind=kind).count() == 1
    assert Gpu.objects.get(pk=mig_gpu.pk).health == "healthy"
