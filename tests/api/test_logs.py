"""``GET /api/v1/allocations/{id}/logs``: any role reads a replica's newest lines, fetched from
the agent of its host; every other outcome is the error envelope (bad ``tail``, no such
allocation, no socket to the agent, no answer in time). The agent is played by a fake responder
on the publish seam; the real socket is exercised in ``tests/live/test_agent_logs.py``."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.agents import logs as agent_logs
from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.inventory.models import HostStatus
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory, allow_process, dedicated_gpus
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _processes_allowed(db):
    """Replicas here run processes: the default team's policy allows them."""
    allow_process()


PROCESS = {"runtime": "process", "command": ["/bin/sh", "-c", "sleep 1000"], "stop_grace_s": 5}


@pytest.fixture
def replica() -> Allocation:
    gpu = GpuFactory(
        host=HostFactory(runtime="process", process_runtime=True), product_key="h100-sxm5-80gb"
    )
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    deployment = deployment_create(
        name="worker",
        request=DeploymentRequest(kind="mps", memory_mib=2048, max_compute_percent=10),
        replicas=1,
        workload=PROCESS,
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)
    return Allocation.objects.select_related("gpu__host").get(deployment=deployment)


@pytest.fixture
def agent(monkeypatch, replica):
    """The host's agent, connected: it answers each request with ``lines`` (for ``host_id``)."""
    sent: list[dict[str, Any]] = []
    behaviour: dict[str, Any] = {"lines": ["ready"], "host_id": replica.gpu.host_id, "mute": False}

    def publish(group: str, event_type: str, payload: dict[str, Any]) -> bool:
        request = payload["message"]
        sent.append({**request, "group": group, "event": event_type})
        if not behaviour["mute"]:
            answer = {
                "type": "logs",
                "request_id": request["request_id"],
                "allocation_id": behaviour.get("allocation_id", request["allocation_id"]),
                "lines": behaviour["lines"][-request["tail"] :],
                "truncated": len(behaviour["lines"]) > request["tail"],
                "error": None,
            }
            agent_logs.logs_answer_store(behaviour["host_id"], answer)
        return True

    monkeypatch.setattr(agent_logs, "publish", publish)
    monkeypatch.setattr(agent_logs, "WAIT_S", 0.3)
    agent_logs.agent_socket_open(replica.gpu.host_id, "channel-1")
    behaviour["sent"] = sent
    yield behaviour
    agent_logs.agent_socket_closed(replica.gpu.host_id, "channel-1")


def logs(client, allocation_id: int, query: str = "") -> Any:
    return client.get(f"/api/v1/allocations/{allocation_id}/logs{query}")


def test_a_viewer_reads_the_newest_lines_the_agent_of_the_host_sent(viewer_client, replica, agent):
    agent["lines"] = [f"line {n}" for n in range(300)]
    response = logs(viewer_client, replica.pk)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["lines"] == [f"line {n}" for n in range(100, 300)]  # 200 by default
    assert body["truncated"] is True and body["error"] is None
    [request] = agent["sent"]
    assert request["group"] == f"agent.host.{replica.gpu.host_id}"
    assert (request["event"], request["allocation_id"], request["tail"]) == (
        "agent.logs_request",
        replica.pk,
        200,
    )
    assert logs(viewer_client, replica.pk, "?tail=5").json() == {
        "lines": [f"line {n}" for n in range(295, 300)],
        "truncated": True,
        "error": None,
    }


@pytest.mark.parametrize("tail", ["0", "5001", "-3", "many", "1.5"])
def test_a_bad_tail_is_refused_before_anything_is_asked(viewer_client, replica, agent, tail):
    body = assert_error(logs(viewer_client, replica.pk, f"?tail={tail}"), 400)
    assert "tail" in body["details"]["fields"]
    assert agent["sent"] == []


def test_an_unknown_allocation_is_a_404(viewer_client, db):
    assert_error(logs(viewer_client, 999_999), 404, "not_found")


def test_without_a_session_or_token_nothing_is_read(anon_client, replica):
    assert logs(anon_client, replica.pk).status_code in (401, 403)


def test_a_host_without_an_agent_socket_is_a_409_saying_why(viewer_client, replica):
    body = assert_error(logs(viewer_client, replica.pk), 409, "logs.agent_unreachable")
    assert "WebSocket" in body["message"] and "REST" in body["message"]
    replica.gpu.host.status = HostStatus.OFFLINE
    replica.gpu.host.save()
    body = assert_error(logs(viewer_client, replica.pk), 409, "logs.agent_unreachable")
    assert "offline" in body["message"]


def test_an_agent_that_does_not_answer_in_time_is_a_504(viewer_client, replica, agent):
    agent["mute"] = True
    body = assert_error(logs(viewer_client, replica.pk), 504, "logs.timeout")
    assert replica.gpu.host.name in body["message"]


def test_an_answer_from_another_host_or_for_another_replica_is_dropped(
    viewer_client, replica, agent
):
    other = HostFactory()
    agent["host_id"] = other.pk
    assert_error(logs(viewer_client, replica.pk), 504, "logs.timeout")
    agent["host_id"], agent["allocation_id"] = replica.gpu.host_id, replica.pk + 1
    assert_error(logs(viewer_client, replica.pk), 504, "logs.timeout")


def test_an_answer_nobody_asked_for_is_not_kept(replica):
    answer = {
        "type": "logs",
        "request_id": "made-up",
        "allocation_id": replica.pk,
        "lines": ["x"],
        "truncated": False,
        "error": None,
    }
    assert agent_logs.logs_answer_store(replica.gpu.host_id, answer) is False  # type: ignore[arg-type]


def test_a_closed_socket_leaves_a_newer_sockets_marker_alone(replica):
    host_id = replica.gpu.host_id
    agent_logs.agent_socket_open(host_id, "old")
    agent_logs.agent_socket_open(host_id, "new")
    agent_logs.agent_socket_closed(host_id, "old")
    assert agent_logs.agent_socket_connected(host_id)
    agent_logs.agent_socket_closed(host_id, "new")
    assert not agent_logs.agent_socket_connected(host_id)


def test_the_logs_of_any_gpu_of_a_replica_of_several_are_its_workloads(viewer_client, monkeypatch):
    """A replica of 2 whole GPUs runs from its first GPU's allocation: asking for the second's
    logs asks the agent for the first's."""
    host = HostFactory(runtime="process", process_runtime=True)
    gpus = dedicated_gpus(host, 2)
    deployment = deployment_create(
        name="train",
        request=DeploymentRequest(kind="gpu", gpu_count=2),
        replicas=1,
        workload=PROCESS,
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=gpus[0].pk)
    first, second = Allocation.objects.filter(deployment=deployment).order_by("gpu_slot")
    asked: list[int] = []

    def publish(group: str, event_type: str, payload: dict[str, Any]) -> bool:
        request = payload["message"]
        asked.append(request["allocation_id"])
        agent_logs.logs_answer_store(
            host.pk,
            {
                "type": "logs",
                "request_id": request["request_id"],
                "allocation_id": request["allocation_id"],
                "lines": ["epoch 1"],
                "truncated": False,
                "error": None,
            },
        )
        return True

    monkeypatch.setattr(agent_logs, "publish", publish)
    agent_logs.agent_socket_open(host.pk, "channel-2")
    try:
        assert logs(viewer_client, second.pk).json()["lines"] == ["epoch 1"]
        assert logs(viewer_client, first.pk).json()["lines"] == ["epoch 1"]
    finally:
        agent_logs.agent_socket_closed(host.pk, "channel-2")
    assert asked == [first.pk, first.pk]
