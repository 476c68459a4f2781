"""A GPU's UUID belongs to one host (security review L6): another host reporting it is ignored
and the conflict is in both hosts' events; an admin forgets the GPU on its old host, and the
host that has it now adopts it with its next hello."""

from __future__ import annotations

import copy
import time

import pytest

from fleet.agents.discovery import agent_hello
from fleet.agents.enrollment import host_issue_token
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.inventory.models import Gpu, HealthEvent, Host
from fleet.inventory.services import host_create
from fleet.inventory.telemetry import get_store
from fleet.inventory.telemetry.codec import GpuTick
from fleet.inventory.telemetry.stores import HostRecord
from tests.agent_sim import SimAgent
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def moved(mem_store):
    """Host a enrolled with its GPU; the GPU was then moved into host b, which reports it."""
    hosts = {}
    for seed, name in enumerate(("a", "b"), start=1):
        host, _ = host_create(name=f"node-{name}")
        host_issue_token(host)
        Host.objects.filter(pk=host.pk).update(hostname=f"sim-{seed}")
        hosts[name] = Host.objects.get(pk=host.pk)
    hello_a = SimAgent(["h100-sxm5-80gb"], seed=1).hello()
    agent_hello(host=hosts["a"], hello=hello_a)
    hello_b = SimAgent(["h100-sxm5-80gb"], seed=2).hello()
    hello_b["gpus"] = copy.deepcopy(hello_a["gpus"])
    gpu = Gpu.objects.get(host=hosts["a"])
    return hosts, gpu, hello_b


def conflicts(host):
    return list(
        HealthEvent.objects.filter(host=host, kind="gpu_conflict").values_list("detail", flat=True)
    )


def test_a_gpu_another_host_holds_is_ignored_and_the_conflict_is_in_both_hosts_events(moved):
    hosts, gpu, hello_b = moved
    agent_hello(host=hosts["b"], hello=hello_b)
    assert Gpu.objects.get(uuid=gpu.uuid).host_id == hosts["a"].pk
    assert not Gpu.objects.filter(host=hosts["b"]).exists()
    (claimed,) = conflicts(hosts["b"])
    assert gpu.uuid in claimed and "node-a" in claimed and f"/gpus/{gpu.pk}/forget" in claimed
    (held,) = conflicts(hosts["a"])
    assert "node-b" in held
    agent_hello(host=hosts["b"], hello=hello_b)  # a reconnect loop adds no more events
    assert len(conflicts(hosts["b"])) == 1 and len(conflicts(hosts["a"])) == 1


def test_an_admin_forgets_the_gpu_and_its_new_host_adopts_it(moved, admin_client):
    hosts, gpu, hello_b = moved
    agent_hello(host=hosts["b"], hello=hello_b)
    Host.objects.filter(pk=hosts["a"].pk).update(status="offline")
    response = admin_client.post(f"/api/v1/gpus/{gpu.pk}/forget")
    assert response.status_code == 200, response.json()
    assert response.json()["kind"] == "forget_gpu" and response.json()["status"] == "succeeded"
    assert not Gpu.objects.filter(pk=gpu.pk).exists()
    agent_hello(host=hosts["b"], hello=hello_b)
    assert Gpu.objects.get(uuid=gpu.uuid).host_id == hosts["b"].pk


def test_only_admins_forget_gpus(moved, viewer_client, operator_client):
    _, gpu, _ = moved
    before = snapshot_rows()
    for client in (viewer_client, operator_client):
        assert_error(client.post(f"/api/v1/gpus/{gpu.pk}/forget"), 403)
    assert snapshot_rows() == before


def test_a_gpu_its_host_still_reports_or_that_holds_replicas_is_not_forgotten(
    moved, admin_client, django_capture_on_commit_callbacks
):
    hosts, gpu, _ = moved
    Host.objects.filter(pk=hosts["a"].pk).update(status="ready")
    Gpu.objects.filter(pk=gpu.pk).update(health="healthy")
    now = time.time()  # a fresh sample of the GPU from host a
    get_store().record_many(
        [HostRecord(hosts["a"].pk, now, now, [GpuTick(gpu.pk, 5.0, 10.0, 40.0, 100.0, {})])]
    )
    before = snapshot_rows()
    forget = f"/api/v1/gpus/{gpu.pk}/forget"
    error = assert_error(admin_client.post(forget), 409, "gpu.still_reported")
    assert "Revoke its agent token" in error["message"]
    assert snapshot_rows() == before

    whole = deployment_create(
        name="whole", request=DeploymentRequest(kind="gpu", gpu_count=1), replicas=1
    )
    with django_capture_on_commit_callbacks(execute=True):
        deployment_place(deployment_id=whole.pk, gpu_id=gpu.pk)
    Host.objects.filter(pk=hosts["a"].pk).update(status="offline")
    before = snapshot_rows()
    assert_error(admin_client.post(forget), 409, "gpu.in_use")
    assert snapshot_rows() == before
    assert_error(admin_client.post("/api/v1/gpus/999999/forget"), 404, "gpu.not_found")


def test_the_hello_says_whether_the_agent_runs_process_workloads(mem_store):
    host, _ = host_create(name="node-p")
    host_issue_token(host)
    Host.objects.filter(pk=host.pk).update(hostname="sim-7")
    agent = SimAgent(["h100-sxm5-80gb"], seed=7)
    hello = {**agent.hello(), "runtime": "docker", "process_runtime": True}

    agent_hello(host=Host.objects.get(pk=host.pk), hello=hello)
    assert Host.objects.get(pk=host.pk).process_runtime is True

    # Restarted without --allow-process-runtime: the key is absent, and so is the permission.
    del hello["process_runtime"]
    agent_hello(host=Host.objects.get(pk=host.pk), hello=hello)
    assert Host.objects.get(pk=host.pk).process_runtime is False


def test_the_hello_says_the_address_its_replicas_are_reached_at(mem_store):
    host, _ = host_create(name="node-a")
    host_issue_token(host)
    Host.objects.filter(pk=host.pk).update(hostname="sim-7")
    agent = SimAgent(["h100-sxm5-80gb"], seed=7)
    hello = {**agent.hello(), "runtime": "docker", "address": "10.0.0.7"}

    agent_hello(host=Host.objects.get(pk=host.pk), hello=hello)
    assert Host.objects.get(pk=host.pk).address == "10.0.0.7"

    del hello["address"]  # restarted without --address
    agent_hello(host=Host.objects.get(pk=host.pk), hello=hello)
    assert Host.objects.get(pk=host.pk).address == ""


def test_an_ack_lost_with_its_socket_is_asked_for_again_at_the_next_hello(
    mem_store, django_capture_on_commit_callbacks
):
    # The agent applies generation 1, then its socket drops before the ack arrives: its next
    # hello says generation 1 is applied, and the operation is still open. The hello asks for
    # the desired state again; the agent's ack then settles the operation.
    from fleet.agents.delivery import agent_ack
    from fleet.agents.documents import host_desired_state
    from fleet.core.models import Operation
    from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout

    host, _ = host_create(name="node-l")
    host_issue_token(host)
    Host.objects.filter(pk=host.pk).update(hostname="sim-3", status="ready")
    agent = SimAgent(["h100-sxm5-80gb"], seed=3)
    assert agent_hello(host=Host.objects.get(pk=host.pk), hello=agent.hello()) is False
    gpu = Gpu.objects.get(host=host)
    with django_capture_on_commit_callbacks(execute=True):
        operation = gpu_set_layout(
            gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("3g.40gb", 0),))
        )
    desired = host_desired_state(Host.objects.get(pk=host.pk))
    agent.apply(desired)  # applied; its ack is lost with the socket

    assert agent_hello(host=Host.objects.get(pk=host.pk), hello=agent.hello()) is True
    assert Operation.objects.get(pk=operation.pk).status not in ("succeeded", "failed")
    with django_capture_on_commit_callbacks(execute=True):
        agent_ack(host=host, ack=agent.apply(host_desired_state(Host.objects.get(pk=host.pk))))
    assert Operation.objects.get(pk=operation.pk).status == "succeeded"
    assert agent_hello(host=Host.objects.get(pk=host.pk), hello=agent.hello()) is False
