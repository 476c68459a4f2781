"""The agent's REST side: one-time enrolment, the report/desired-state fallback, and tokens
scoped to their own host."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleet.core.models import Operation
from fleet.inventory.models import Gpu, Host
from fleet.inventory.services import host_create
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.agent_sim import SimAgent
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


def enroll(token: str, hostname: str = "sim-0"):
    return APIClient().post(
        "/api/v1/agent/enroll", {"enrollment_token": token, "hostname": hostname}, format="json"
    )


def agent_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def test_an_enrollment_token_is_traded_once_for_a_hashed_host_token():
    host, enrollment = host_create(name="gpu-01")
    response = enroll(enrollment)
    assert response.status_code == 201
    body = response.json()
    assert body["host_id"] == host.pk and body["token"].startswith("flh_")
    host.refresh_from_db()
    assert body["token"] not in (host.token_hash, host.token_prefix) and len(host.token_hash) == 64
    assert host.hostname == "sim-0" and host.enrollment_token_hash == ""
    assert_error(enroll(enrollment), 401, "agent.enrollment_refused")
    assert Operation.objects.filter(kind="enroll_host", host=host).exists()


def test_expired_and_unknown_enrollment_tokens_are_refused():
    host, enrollment = host_create(name="gpu-01")
    Host.objects.filter(pk=host.pk).update(enrollment_expires_at="2000-01-01T00:00:00Z")
    assert_error(enroll(enrollment), 401, "agent.enrollment_expired")
    assert_error(enroll("fle_00000000_nothing"), 401, "agent.enrollment_refused")
    assert_error(APIClient().post("/api/v1/agent/enroll", {}, format="json"), 400, "invalid")


def test_the_rest_fallback_reports_and_gets_desired_state():
    host, enrollment = host_create(name="gpu-01")
    client = agent_client(enroll(enrollment).json()["token"])
    agent = SimAgent(["a100-sxm4-40gb"])
    assert client.get("/api/v1/agent/desired-state").status_code == 204
    response = client.post(
        "/api/v1/agent/report", {"messages": [agent.hello(), agent.telemetry()]}, format="json"
    )
    assert response.json() == {"accepted": 2}
    gpu = Gpu.objects.get(host=host)
    op = gpu_set_layout(
        gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("7g.40gb", 0),))
    )
    desired = client.get("/api/v1/agent/desired-state").json()
    assert desired["type"] == "desired_state" and desired["generation"] == 1
    op.refresh_from_db()
    assert op.status == "dispatched"
    client.post("/api/v1/agent/report", {"messages": [agent.apply(desired)]}, format="json")
    op.refresh_from_db()
    assert op.status == "succeeded"


def test_malformed_reports_are_refused_whole():
    _, enrollment = host_create(name="gpu-01")
    client = agent_client(enroll(enrollment).json()["token"])
    agent = SimAgent(["a30-24gb"])
    body = assert_error(
        client.post(
            "/api/v1/agent/report", {"messages": [agent.hello(), {"type": "hello"}]}, format="json"
        ),
        400,
        "protocol.invalid",
    )
    assert "1" in str(body["details"])
    assert not Gpu.objects.exists()
    assert_error(
        client.post(
            "/api/v1/agent/report",
            {"messages": [{"type": "desired_state", "generation": 1, "gpus": {}}]},
            format="json",
        ),
        400,
    )


def test_agent_endpoints_refuse_users_and_wrong_tokens(operator_client):
    assert_error(operator_client.get("/api/v1/agent/desired-state"), 401)
    assert_error(agent_client("flh_00000000_forged").get("/api/v1/agent/desired-state"), 401)
    assert_error(APIClient().post("/api/v1/agent/report", {"messages": []}, format="json"), 401)


def test_a_host_token_only_ever_reaches_its_own_host():
    a, enroll_a = host_create(name="a")
    b, enroll_b = host_create(name="b")
    token_a = enroll(enroll_a).json()["token"]
    token_b = enroll(enroll_b, hostname="sim-3").json()["token"]
    agent_b = SimAgent(["a30-24gb"], seed=3)
    agent_client(token_b).post(
        "/api/v1/agent/report", {"messages": [agent_b.hello()]}, format="json"
    )
    gpu_b = Gpu.objects.get(host=b)
    gpu_set_layout(
        gpu_id=gpu_b.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("4g.24gb", 0),))
    )
    # A's token sees only A's (empty) desired state, never B's.
    assert agent_client(token_a).get("/api/v1/agent/desired-state").status_code == 204
    # A replays B's hello and an ack for B's generation: B is untouched.
    forged_ack = {
        "type": "ack",
        "generation": 1,
        "status": "applied",
        "items": [],
        "observed": agent_b.hello()["gpus"],
    }
    agent_client(token_a).post(
        "/api/v1/agent/report", {"messages": [agent_b.hello(), forged_ack]}, format="json"
    )
    assert Gpu.objects.get(pk=gpu_b.pk).host_id == b.pk
    assert Host.objects.get(pk=b.pk).applied_generation == 0
    assert Operation.objects.get(kind="set_layout").status != "succeeded"
    assert Host.objects.get(pk=a.pk).applied_generation == 0


def test_a_report_from_another_machine_is_refused():
    _, enrollment = host_create(name="gpu-01")
    client = agent_client(enroll(enrollment, hostname="node-a").json()["token"])
    intruder = SimAgent(["a30-24gb"])  # reports hostname "sim-0"
    assert_error(
        client.post("/api/v1/agent/report", {"messages": [intruder.hello()]}, format="json"),
        403,
        "agent.wrong_host",
    )
    assert not Gpu.objects.exists()


def test_an_allocation_tells_its_process_where_and_how_to_run(operator_client):
    host, enrollment = host_create(name="gpu-01")
    client = agent_client(enroll(enrollment).json()["token"])
    agent = SimAgent(["a30-24gb", "h100-sxm5-80gb"])
    client.post("/api/v1/agent/report", {"messages": [agent.hello()]}, format="json")
    a30, h100 = Gpu.objects.filter(host=host).order_by("index")
    Host.objects.filter(pk=host.pk).update(status="ready")
    gpu_set_layout(gpu_id=a30.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    gpu_set_layout(
        gpu_id=h100.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("3g.40gb", 4),))
    )
    mps = operator_client.post(
        "/api/v1/deployments/",
        {"name": "asr", "kind": "mps", "memory_mib": 2048, "max_compute_percent": 25},
        format="json",
    ).json()
    mig = operator_client.post(
        "/api/v1/deployments/", {"name": "chat", "kind": "mig", "profile": "3g.40gb"}, format="json"
    ).json()
    operator_client.post(f"/api/v1/deployments/{mps['id']}/place", {"gpu": a30.pk}, format="json")
    operator_client.post(f"/api/v1/deployments/{mig['id']}/place", {"gpu": h100.pk}, format="json")
    desired = client.get("/api/v1/agent/desired-state").json()
    client.post("/api/v1/agent/report", {"messages": [agent.apply(desired)]}, format="json")
    envs = {
        a["deployment_name"]: a["environment"]
        for a in operator_client.get("/api/v1/allocations/").json()["results"]
    }
    assert envs["asr"]["CUDA_VISIBLE_DEVICES"] == a30.uuid
    assert envs["asr"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{a30.uuid}=2048M"
    assert envs["asr"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert envs["asr"]["CUDA_MPS_PIPE_DIRECTORY"]  # the agent's daemon for that GPU
    assert envs["chat"]["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert set(envs["chat"]) == {"CUDA_VISIBLE_DEVICES"}


def test_a_report_past_the_hosts_budget_skips_the_excess_and_counts_it(mem_store):
    import time

    from fleet.inventory import refusals
    from fleet.inventory.models import HealthEvent

    _, enrollment = host_create(name="gpu-storm")
    client = agent_client(enroll(enrollment).json()["token"])
    agent = SimAgent(["a30-24gb"])
    uuid = agent.hello()["gpus"][0]["uuid"]
    event = {
        "type": "event",
        "kind": "xid",
        "gpu_uuid": uuid,
        "gpu_instance_id": None,
        "xid": 13,
        "detail": "application error",
        "ts": time.time(),
    }
    refusals.clear()
    response = client.post(
        "/api/v1/agent/report", {"messages": [agent.hello(), *[event] * 40]}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json() == {"accepted": 11}  # the hello and the first 10 events of the GPU
    assert HealthEvent.objects.filter(kind="xid").count() == 10
    host_id = Host.objects.get(name="gpu-storm").pk
    assert refusals.totals()[(host_id, "rate_limited")] == 30


def test_a_rest_report_from_an_agent_this_server_does_not_serve_is_refused_426():
    host, enrollment = host_create(name="gpu-01")
    client = agent_client(enroll(enrollment).json()["token"])
    hello = SimAgent(["a100-sxm4-40gb"]).hello()
    hello["protocol"] = 0
    response = client.post("/api/v1/agent/report", {"messages": [hello]}, format="json")
    assert_error(response, 426, "agent.protocol_unsupported")
    assert not Gpu.objects.filter(host=host).exists()
