"""The dashboard shows what replicas run: the workload state on their slice, *n running* in the
tray, a releasing replica as stopping, and GPU processes named by their replica."""

from __future__ import annotations

import time

import pytest

from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.services import deployment_evict
from fleet.allocations.workloads import workloads_record
from fleet.inventory.models import Gpu, Host

pytestmark = pytest.mark.django_db

CONTAINER = {"runtime": "container", "image": "registry.example/llm:1.2"}


def _status(allocation_id: int, state: str) -> dict:
    return {
        "allocation_id": allocation_id,
        "state": state,
        "started_at": time.time(),
        "exit_code": None,
        "restarts": 0,
        "message": "",
        "pids": [],
    }


@pytest.fixture
def running(small_fleet):
    """llama-chat runs a container on the MIG GPU's 3g.40gb slice, reported running."""
    workload = {**Deployment.objects.get(pk=small_fleet["deployment"].pk).workload, **CONTAINER}
    Deployment.objects.filter(pk=small_fleet["deployment"].pk).update(workload=workload)
    Host.objects.filter(pk=small_fleet["host"].pk).update(runtime="docker")
    allocation = Allocation.objects.get(deployment=small_fleet["deployment"])
    # The agent applied it; the copy runs the container (each copy keeps what it was placed with).
    Allocation.objects.filter(pk=allocation.pk).update(state="active", workload=workload)
    workloads_record(
        host_id=small_fleet["host"].pk, statuses=[_status(allocation.pk, "running")], full=False
    )
    return allocation


def test_the_slice_and_the_tray_show_the_workload_running(operator_web, small_fleet, running):
    card = operator_web.get(f"/ui/cards?gpu={small_fleet['mig'].pk}").content.decode()
    assert f'data-allocation="{running.pk}" data-workload="running"' in card
    tray = operator_web.get("/ui/tray").content.decode()
    assert "1 running" in tray and "container" in tray


def test_a_crash_loop_shows_on_the_slice_and_in_the_tray(operator_web, small_fleet, running):
    workloads_record(
        host_id=small_fleet["host"].pk, statuses=[_status(running.pk, "crashloop")], full=False
    )
    card = operator_web.get(f"/ui/cards?gpu={small_fleet['mig'].pk}").content.decode()
    assert 'data-workload="crashloop"' in card
    tray = operator_web.get("/ui/tray").content.decode()
    assert "0 running" in tray and "1 failing" in tray


def test_an_evicted_replica_shows_as_stopping_until_its_slice_is_free(
    operator_web, small_fleet, running
):
    deployment_evict(deployment_id=small_fleet["deployment"].pk)
    card = operator_web.get(f"/ui/cards?gpu={small_fleet['mig'].pk}").content.decode()
    assert 'class="a rchip releasing"' in card and 'data-workload="stopping"' in card
    tray = operator_web.get("/ui/tray").content.decode()
    assert "0/2 placed" in tray and "1 stopping" in tray


def test_gpu_processes_are_named_by_their_replica(operator_web, small_fleet, running):
    mig = small_fleet["mig"]
    observed = {"mig_instances": [{"gpu_instance_id": 2, "start": small_fleet["three_g"].start}]}
    Gpu.objects.filter(pk=mig.pk).update(
        observed=observed,
        last_telemetry={
            "processes": [
                {
                    "pid": 4242,
                    "used_memory_mib": 9000,
                    "gpu_instance_id": 2,
                    "compute_instance_id": 0,
                    "allocation_id": running.pk,
                },
                {"pid": 77, "used_memory_mib": 10, "gpu_instance_id": 2, "compute_instance_id": 0},
            ]
        },
    )
    html = operator_web.get(f"/ui/gpus/{mig.pk}/panel").content.decode()
    assert "replica 0 of llama-chat · pid 4242" in html
    assert ">pid 77 ·" in html
