"""``GET /api/v1/allocations/{id}/logs``: any role reads a replica's newest lines, fetched from
the agent of its host; every other outcome is the error envelope (bad ``tail``, no such
allocation, no socket to the agent, no answer in time). The agent is played by a fake responder
on the publish seam (answering as an agent of the previous release, without stamps or cursors,
or, given a ``ring``, with the agent's own ring and answer code); the real socket is exercised in
``tests/live/test_agent_logs.py``."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.agents import logs as agent_logs
from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.inventory.models import HostStatus
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from hostagent.runtime.output import OutputRing, search
from hostagent.runtime.sync import logs_answer_of
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
        ring = behaviour.get("ring")
        if not behaviour["mute"] and ring is not None:
            answer = logs_answer_of(request, agent_output(ring, request))
            agent_logs.logs_answer_store(behaviour["host_id"], answer)
        elif not behaviour["mute"]:
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


def agent_output(ring: OutputRing, request: dict[str, Any]) -> Any:
    """What the agent's supervisor reads for ``request`` from a replica's ring."""
    q, before = request.get("q"), request.get("before")
    if not q:
        return ring.page(request["tail"], before=before)
    return search(ring.page(20_000, before=before), q, request["tail"])


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
        "timestamps": [None] * 5,  # an agent of the previous release stamps nothing
        "cursors": None,
        "older_gone": False,
    }


@pytest.mark.parametrize("tail", ["0", "5001", "-3", "many", "1.5"])
def test_a_bad_tail_is_refused_before_anything_is_asked(viewer_client, replica, agent, tail):
    body = assert_error(logs(viewer_client, replica.pk, f"?tail={tail}"), 400)
    assert "tail" in body["details"]["fields"]
    assert agent["sent"] == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("?before=0", "before"),
        ("?before=x", "before"),
        (f"?before={2**53 + 1}", "before"),
        ("?q=" + "x" * 201, "q"),
        ("?q=a%00b", "q"),
        ("?download=perhaps", "download"),
    ],
)
def test_a_bad_cursor_search_or_download_is_refused_before_anything_is_asked(
    viewer_client, replica, agent, query, field
):
    body = assert_error(logs(viewer_client, replica.pk, query), 400)
    assert field in body["details"]["fields"]
    assert agent["sent"] == []


def stamped_ring(lines: int, at: float = 1_780_000_000.0) -> OutputRing:
    """A replica's ring as the agent keeps it: ``lines`` lines, one captured a second."""
    ring = OutputRing(max_lines=50)
    for n in range(lines):
        ring.capture(f"line {n}\n".encode(), at + n)
    return ring


def test_lines_come_with_the_time_the_agent_captured_them_and_a_cursor(
    viewer_client, replica, agent
):
    agent["ring"] = stamped_ring(10)
    body = logs(viewer_client, replica.pk, "?tail=3").json()
    assert body["lines"] == ["line 7", "line 8", "line 9"]
    assert body["timestamps"] == [
        "2026-05-28T20:26:47.000Z",
        "2026-05-28T20:26:48.000Z",
        "2026-05-28T20:26:49.000Z",
    ]
    assert body["cursors"] == [8, 9, 10] and body["truncated"] is True
    assert body["older_gone"] is False


def test_older_lines_come_on_demand_until_the_ring_says_they_are_gone(
    viewer_client, replica, agent
):
    agent["ring"] = stamped_ring(80)  # the ring keeps 50: lines 30..79
    newest = logs(viewer_client, replica.pk, "?tail=20").json()
    assert newest["lines"][0] == "line 60" and newest["older_gone"] is False
    older = logs(viewer_client, replica.pk, f"?tail=20&before={newest['cursors'][0]}").json()
    assert older["lines"] == [f"line {n}" for n in range(40, 60)]
    assert older["truncated"] is True and older["older_gone"] is False
    oldest = logs(viewer_client, replica.pk, f"?tail=20&before={older['cursors'][0]}").json()
    assert oldest["lines"] == [f"line {n}" for n in range(30, 40)]
    assert oldest["older_gone"] is True  # lines 0..29 left the ring
    past = logs(viewer_client, replica.pk, "?tail=20&before=5").json()
    assert past["lines"] == [] and past["older_gone"] is True
    assert agent["sent"][1]["before"] == newest["cursors"][0]


def test_a_search_is_made_by_the_agent_over_all_it_keeps(viewer_client, replica, agent):
    agent["ring"] = stamped_ring(40)
    body = logs(viewer_client, replica.pk, "?tail=2&q=LINE%201").json()
    # line 1, line 10..19: the newest two, though 20 newer lines do not match
    assert body["lines"] == ["line 18", "line 19"] and body["truncated"] is True
    assert body["cursors"] == [19, 20]
    assert agent["sent"][0]["q"] == "LINE 1"


def test_an_agent_of_the_previous_release_is_searched_here_and_not_paged(
    viewer_client, replica, agent
):
    agent["lines"] = ["ready", "error: disk", "done", "Error again"]
    body = logs(viewer_client, replica.pk, "?q=error").json()
    assert body["lines"] == ["error: disk", "Error again"] and body["truncated"] is True
    refused = assert_error(logs(viewer_client, replica.pk, "?before=3"), 409, "logs.no_older")
    assert refused["details"] == {"before": 3}


def test_download_is_the_lines_as_text_each_after_its_time(viewer_client, replica, agent):
    agent["ring"] = stamped_ring(3)
    response = logs(viewer_client, replica.pk, "?download=true")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"] == (
        f'attachment; filename="replica-{replica.pk}-logs.txt"'
    )
    assert response.content.decode() == (
        "2026-05-28T20:26:40.000Z line 0\n"
        "2026-05-28T20:26:41.000Z line 1\n"
        "2026-05-28T20:26:42.000Z line 2\n"
    )
    agent.pop("ring")
    agent["lines"] = ["no time"]
    assert logs(viewer_client, replica.pk, "?download=1").content == b"no time\n"


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
