"""Fault containment at the agent boundary: whatever one host's agent sends, nothing raises
outside that host's handling and no other host's rows, partitions, allocations or telemetry
change; refused messages are answered, counted and rate-limited; one agent cannot slow another."""

from __future__ import annotations

import asyncio
import json
import time
import typing
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.agents import ingest
from fleet.agents.discovery import agent_hello, gpus_adopt
from fleet.agents.enrollment import host_authenticate, host_issue_token
from fleet.agents.guard import AgentGuard, Refused
from fleet.agents.logs import logs_answer_store
from fleet.agents.messages import handle_message
from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create
from fleet.asgi import application
from fleet.core.errors import ServiceError
from fleet.inventory import refusals
from fleet.inventory.models import Gpu, HealthEvent, Host, HostStatus
from fleet.inventory.selectors import latest_telemetry
from fleet.inventory.services import host_create, host_revoke_token
from fleet.partitioning.models import Partition
from hostagent import protocol
from tests.agent_sim import SimAgent

# -- a fleet: two honest hosts with replicas, one hostile host ------------------------------


def _host(name: str, products: list[str], seed: int) -> tuple[Host, SimAgent, str]:
    host, _ = host_create(name=name)
    token = host_issue_token(host)
    agent = SimAgent(products, seed=seed)
    agent_hello(host=Host.objects.get(pk=host.pk), hello=agent.hello())
    return Host.objects.get(pk=host.pk), agent, token


def _fleet() -> dict[str, Any]:
    honest = [_host(f"honest-{i}", ["a30-24gb", "h100-sxm5-80gb"], seed=10 + i) for i in range(2)]
    hostile = _host("hostile", ["h100-sxm5-80gb"], seed=99)
    deployment = deployment_create(
        name="chat", request=DeploymentRequest(kind="gpu", gpu_count=1), replicas=3
    )
    deployment_autoplace(deployment_id=deployment.pk)
    # The hostile host holds no replica: a fault it reports moves nothing onto the others.
    Allocation.objects.filter(gpu__host=hostile[0]).delete()
    for host, agent, _ in honest:
        now = time.time()
        ingest.ingest([ingest.Tick(host.pk, host.created_at.timestamp(), now, agent.telemetry())])
    return {"honest": honest, "hostile": hostile}


def _state_of(host_ids: list[int]) -> dict[str, Any]:
    gpus = Gpu.objects.filter(host_id__in=host_ids).order_by("pk")
    gpu_ids = [g.pk for g in gpus]
    return {
        "hosts": list(
            Host.objects.filter(pk__in=host_ids)
            .order_by("pk")
            .values("pk", "status", "hostname", "desired_generation", "applied_generation")
        ),
        "gpus": list(
            gpus.values(
                "pk", "uuid", "mode", "health", "cordoned", "reported_placements", "observed"
            )
        ),
        "partitions": list(
            Partition.objects.filter(gpu_id__in=gpu_ids)
            .order_by("pk")
            .values("pk", "gpu_id", "profile_id", "start", "size", "uuid")
        ),
        "allocations": list(
            Allocation.objects.filter(gpu_id__in=gpu_ids)
            .order_by("pk")
            .values(
                "pk",
                "gpu_id",
                "partition_id",
                "replica",
                "workload_state",
                "started_at",
                "exit_code",
                "restarts",
                "workload_message",
            )
        ),
        "telemetry": {k: v["sample"] for k, v in latest_telemetry(gpu_ids).items()},
        "events": HealthEvent.objects.filter(host_id__in=host_ids).count(),
    }


# -- fuzzing every message type -------------------------------------------------------------

DEEP: Any = 1
for _ in range(300):
    DEEP = {"x": [DEEP]}
EXTREMES: list[Any] = [
    1e308,
    -1e308,
    2**63,
    -(2**63),
    -1,
    0,
    None,
    True,
    "",
    "\n" * 300,
    "x" * 5000,
    [],
    [[0]],
    [[0, 1, 2]],
    [[99, 99]],
    {},
    {"x": 1},
    DEEP,
]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*path, index))
    return out


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    copy = json.loads(json.dumps(value))
    target = copy
    for step in path[:-1]:
        target = target[step]
    if isinstance(target, dict) and isinstance(path[-1], str) and path[-1].startswith("+"):
        target[path[-1][1:]] = new  # an unknown key
    else:
        target[path[-1]] = new
    return copy


def _messages(agent: SimAgent, host: Host, theirs: int) -> list[dict[str, Any]]:
    """One message of every type an agent sends; ``theirs``: another host's replica, which
    the workload report and the logs answer claim."""
    uuid = agent.backend.list_gpus()[0].uuid
    now = time.time()
    return [
        dict(agent.hello()),
        dict(agent.telemetry()),
        {
            "type": "event",
            "kind": "mps_up",
            "gpu_uuid": uuid,
            "gpu_instance_id": None,
            "xid": None,
            "detail": "",
            "ts": now,
        },
        {
            "type": "ack",
            "generation": host.desired_generation,
            "status": "applied",
            "items": [],
            "observed": agent.hello()["gpus"],
        },
        {"type": "pong", "nonce": "n", "ts": now},
        {
            "type": "workloads",
            "ts": now,
            "full": True,
            "workloads": [
                {
                    "allocation_id": theirs,
                    "state": "crashloop",
                    "started_at": now,
                    "exit_code": 1,
                    "restarts": 9,
                    "message": "hostile",
                    "pids": [1],
                }
            ],
        },
        {
            "type": "logs",
            "request_id": "r-1",
            "allocation_id": theirs,
            "lines": ["x"],
            "truncated": False,
            "error": None,
        },
    ]


UP_TYPES = {
    typing.get_args(typing.get_type_hints(kind)["type"])[0]
    for kind in typing.get_args(protocol.UpMessage)
}


def _with_duplicate_key(
    raw: str, message: dict[str, Any], key: str, value: Any, first: bool
) -> str:
    """``raw`` with ``key`` once more at the top level: before the real one or after it."""
    extra = f"{json.dumps(key)}: {json.dumps(value)}"
    if first or not message:
        return "{" + extra + (", " if message else "") + raw[1:]
    return raw[:-1] + ", " + extra + "}"


def _handle(host: Host, raw: str, honest_ticks: list[ingest.Tick]) -> str:
    """What the socket does with one message, the hostile tick batched with honest ones."""
    try:
        message = AgentGuard().admit(raw)
    except Refused:
        return "refused"
    if message["type"] == "telemetry":
        tick = ingest.Tick(host.pk, host.created_at.timestamp(), time.time(), message)
        ingest.ingest([*honest_ticks, tick])
        return "stored"
    if message["type"] == "logs":  # as the socket does: kept for a request of this host's
        logs_answer_store(host.pk, message)
        return "handled"
    try:
        handle_message(host.pk, message)
    except ServiceError:  # WrongHost and friends: refused by the service, nothing written
        return "refused"
    return "handled"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("mem_store")
def test_fuzzed_messages_from_one_host_never_change_another_hosts_state():
    fleet = _fleet()
    hostile, agent, _ = fleet["hostile"]
    honest_ids = [h.pk for h, _, _ in fleet["honest"]]
    before = _state_of(honest_ids)
    assert before["allocations"] and before["telemetry"]
    theirs = Allocation.objects.filter(gpu__host_id__in=honest_ids).order_by("pk").first()
    assert theirs is not None
    messages = _messages(agent, hostile, theirs.pk)
    assert {m["type"] for m in messages} == UP_TYPES  # every type an agent may send
    outcomes: dict[str, int] = {}

    @given(data=st.data())
    @settings(
        max_examples=250,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    def one_message(data: Any) -> None:
        message = data.draw(st.sampled_from(messages))
        variant = message
        paths = [p for p in _paths(message) if p and p != ("type",)]
        for _ in range(data.draw(st.integers(1, 3))):
            path = data.draw(st.sampled_from(paths))
            if data.draw(st.booleans()):
                path = (*path[:-1], f"+{path[-1]}")
            try:
                variant = _replaced(variant, path, data.draw(st.sampled_from(EXTREMES)))
            except (KeyError, IndexError, TypeError):
                continue
        raw = json.dumps(variant)
        if data.draw(st.integers(0, 3)) == 0:  # a key twice: JSON says nothing of which wins
            key = data.draw(st.sampled_from(sorted(variant)))
            raw = _with_duplicate_key(
                raw, variant, key, data.draw(st.sampled_from(EXTREMES)), data.draw(st.booleans())
            )
        # The honest hosts tick in the same batch: their values are the same as before.
        honest = [
            ingest.Tick(h.pk, h.created_at.timestamp(), time.time(), a.telemetry())
            for h, a, _ in fleet["honest"]
        ]
        outcome = _handle(hostile, raw, honest)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    one_message()
    after = _state_of(honest_ids)
    assert after["hosts"] == before["hosts"]
    assert after["gpus"] == before["gpus"]
    assert after["partitions"] == before["partitions"]
    assert after["allocations"] == before["allocations"]
    assert after["events"] == before["events"]
    assert set(after["telemetry"]) == set(before["telemetry"])  # still reporting, every GPU
    assert outcomes.get("refused", 0) > 20 and sum(outcomes.values()) == 250


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("mem_store")
def test_a_tick_that_cannot_be_stored_costs_only_its_own_host():
    fleet = _fleet()
    (good, good_agent, _), (other, other_agent, _) = fleet["honest"]
    Host.objects.update(last_seen_at=None)
    ingest.forget_all()  # last_seen_at was written a moment ago: write it again
    bad = good_agent.telemetry()
    bad["gpus"][0]["utilization_gpu_percent"] = 1e308  # past the boundary: the second wall
    bad["gpus"][0]["power_mw"] = float("inf")  # type: ignore[typeddict-item]
    now = time.time()
    done = ingest.ingest(
        [
            ingest.Tick(good.pk, good.created_at.timestamp(), now, bad),
            ingest.Tick(other.pk, other.created_at.timestamp(), now, other_agent.telemetry()),
        ]
    )
    other_gpus = set(Gpu.objects.filter(host=other).values_list("pk", flat=True))
    assert {int(k) for k in done.live} >= other_gpus
    assert Host.objects.filter(last_seen_at__isnull=True).count() == 1  # the hostile one only
    assert set(latest_telemetry(list(other_gpus))) == other_gpus


# -- the socket: refusals answered, counted, limited ----------------------------------------


def _connect(token: str) -> WebsocketCommunicator:
    return WebsocketCommunicator(
        application, "/ws/agent/", headers=[(b"authorization", f"Token {token}".encode())]
    )


@pytest.mark.django_db(transaction=True)
def test_refused_messages_are_answered_counted_and_abuse_closes_the_socket():
    host, agent, token = _host("noisy", ["a30-24gb"], seed=3)
    refusals.clear()

    async def scenario() -> int | None:
        socket = _connect(token)
        assert (await socket.connect())[0]
        tick = agent.telemetry()
        tick["gpus"][0]["utilization_gpu_percent"] = 1e308
        await socket.send_json_to(tick)
        frame = await socket.receive_json_from()
        assert frame["code"] == "protocol.invalid" and frame["refused"] is None
        assert "utilization_gpu_percent" in frame["message"]
        for _ in range(40):
            await socket.send_to(text_data="[]")
        closed = None
        for _ in range(60):
            out = await socket.receive_output(timeout=2)
            if out["type"] == "websocket.close":
                closed = out["code"]
                break
        await socket.disconnect()
        return closed

    assert async_to_sync(scenario)() == protocol.CLOSE_ABUSE
    refusals.flush()
    counted = refusals.totals()
    assert counted[(host.pk, "invalid")] == 31  # a burst of 30 refusals, and the 31st closes


def test_telemetry_past_two_a_second_is_refused_as_rate_limited():
    guard = AgentGuard()
    agent = SimAgent(["a30-24gb"], seed=4)
    raw = json.dumps(agent.telemetry())
    admitted = 0
    reasons: set[str] = set()
    for i in range(20):  # 20 ticks in 2 s
        try:
            guard.admit(raw, now=100 + i / 10)
            admitted += 1
        except Refused as refusal:
            reasons.add(refusal.reason)
    assert reasons == {"rate_limited"}
    assert admitted <= 5 + 2 * 2 + 1


def test_events_are_limited_per_gpu():
    guard = AgentGuard()
    event = {
        "type": "event",
        "kind": "xid",
        "gpu_uuid": "GPU-a",
        "gpu_instance_id": None,
        "xid": 79,
        "detail": "",
        "ts": time.time(),
    }
    accepted = 0
    for _ in range(30):
        try:
            guard.admit(json.dumps(event), now=50.0)
            accepted += 1
        except Refused:
            pass
    assert accepted == 10
    guard.admit(json.dumps({**event, "gpu_uuid": "GPU-b"}), now=50.0)  # another GPU's budget


def test_a_timestamp_a_day_away_is_refused():
    event = {
        "type": "pong",
        "nonce": "n",
        "ts": time.time() + 2 * 86_400,
    }
    with pytest.raises(Refused) as refused:
        AgentGuard().admit(json.dumps(event))
    assert refused.value.reason == "stale_ts"


# -- one agent cannot slow the others -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_agent_looping_hellos_does_not_delay_another_agents_event():
    _, loud_agent, loud_token = _host("loud", ["h100-sxm5-80gb"] * 8, seed=5)
    quiet, quiet_agent, quiet_token = _host("quiet", ["a30-24gb"], seed=6)
    uuid = quiet_agent.backend.list_gpus()[0].uuid

    async def scenario() -> float:
        loud, calm = _connect(loud_token), _connect(quiet_token)
        assert (await loud.connect())[0] and (await calm.connect())[0]
        hello = json.dumps(loud_agent.hello())

        async def flood() -> None:
            for _ in range(200):
                await loud.send_to(text_data=hello)
                await asyncio.sleep(0)

        flooding = asyncio.ensure_future(flood())
        await asyncio.sleep(0.2)
        started = time.monotonic()
        await calm.send_json_to(
            {
                "type": "event",
                "kind": "xid",
                "gpu_uuid": uuid,
                "gpu_instance_id": None,
                "xid": 13,
                "detail": "application error",
                "ts": time.time(),
            }
        )
        while not await sync_to_async(HealthEvent.objects.filter(host=quiet, kind="xid").exists)():
            assert time.monotonic() - started < 5
            await asyncio.sleep(0.02)
        took = time.monotonic() - started
        await flooding
        await loud.disconnect()
        await calm.disconnect()
        return took

    assert async_to_sync(scenario)() < 1.0


# -- one socket per host, revocation ---------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_second_socket_of_a_host_replaces_the_first_and_it_is_recorded():
    host, agent, token = _host("twice", ["a30-24gb"], seed=7)

    async def scenario() -> int:
        first, second = _connect(token), _connect(token)
        assert (await first.connect())[0]
        assert (await second.connect())[0]
        closed = await first.receive_output(timeout=2)
        await second.send_json_to(agent.hello())
        assert await second.receive_nothing(0.2)
        await second.disconnect()
        return int(closed["code"])

    assert async_to_sync(scenario)() == protocol.CLOSE_REPLACED
    assert HealthEvent.objects.filter(host=host, kind="agent_replaced").count() == 1


@pytest.mark.django_db(transaction=True)
def test_revoking_a_host_token_closes_its_socket_within_a_second(admin_client):
    host, _, token = _host("revoked", ["a30-24gb"], seed=8)

    async def scenario() -> float:
        socket = _connect(token)
        assert (await socket.connect())[0]
        started = time.monotonic()
        response = await sync_to_async(admin_client.post)(f"/api/v1/hosts/{host.pk}/revoke-token")
        assert response.status_code == 200, response.content
        closed = await socket.receive_output(timeout=1)
        assert closed == {"type": "websocket.close", "code": protocol.CLOSE_REVOKED}
        return time.monotonic() - started

    assert async_to_sync(scenario)() < 1.0
    assert host_authenticate(token) is None


@pytest.mark.django_db(transaction=True)
def test_rotating_a_host_token_closes_the_old_socket_but_not_the_new_one():
    host, _, old = _host("rotated", ["a30-24gb"], seed=9)

    async def scenario() -> None:
        stale = _connect(old)
        assert (await stale.connect())[0]
        new = await sync_to_async(host_issue_token)(host)
        assert (await stale.receive_output(timeout=1))["code"] in (
            protocol.CLOSE_REVOKED,
            protocol.CLOSE_REPLACED,
        )
        fresh = _connect(new)
        assert (await fresh.connect())[0]
        await sync_to_async(host_revoke_token)(host_id=host.pk)  # then revoked: closes
        assert (await fresh.receive_output(timeout=1))["code"] == protocol.CLOSE_REVOKED

    async_to_sync(scenario)()


def test_viewers_and_operators_cannot_revoke_a_host_token(viewer_client, operator_client, db):
    host, _ = host_create(name="kept")
    for client in (viewer_client, operator_client):
        assert client.post(f"/api/v1/hosts/{host.pk}/revoke-token").status_code == 403


# -- back from offline, whatever the message ----------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("mem_store")
def test_a_telemetry_tick_or_an_event_brings_an_offline_host_back():
    host, agent, _ = _host("blinked", ["a30-24gb"], seed=11)
    Host.objects.filter(pk=host.pk).update(status=HostStatus.OFFLINE)
    ingest.forget_all()
    ingest.ingest(
        [ingest.Tick(host.pk, host.created_at.timestamp(), time.time(), agent.telemetry())]
    )
    assert Host.objects.get(pk=host.pk).status == HostStatus.READY
    Host.objects.filter(pk=host.pk).update(status=HostStatus.OFFLINE)
    handle_message(host.pk, {"type": "pong", "nonce": "n", "ts": time.time()})
    assert Host.objects.get(pk=host.pk).status == HostStatus.READY
    Host.objects.filter(pk=host.pk).update(status=HostStatus.CORDONED)
    handle_message(host.pk, {"type": "pong", "nonce": "n", "ts": time.time()})
    assert Host.objects.get(pk=host.pk).status == HostStatus.CORDONED  # the operator's state


# -- stored values read defensively ---------------------------------------------------------


@pytest.mark.django_db
def test_malformed_stored_placements_are_ignored_and_the_fleet_page_renders(viewer):
    from django.test import Client

    from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout

    host, _, _ = _host("stored", ["h100-sxm5-80gb"], seed=12)
    gpu = Gpu.objects.get(host=host)
    Gpu.objects.filter(pk=gpu.pk).update(
        mode="mig",
        mig_enabled=True,
        reported_placements={
            "x": {"name": "1g.10gb", "placements": [[0, 1]]},
            "19": {"name": "1g.10gb", "placements": [[0]]},
            "9": {"name": "3g.40gb", "placements": [[0, 4], [4, 40000]]},
        },
    )
    client = Client()
    client.force_login(viewer)
    assert client.get("/").status_code == 200
    assert client.get(f"/gpus/{gpu.pk}/").status_code == 200
    gpu_set_layout(
        gpu_id=gpu.pk,
        spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec(profile="1g.10gb", start=0),)),
    )


@pytest.mark.django_db
def test_a_hello_reporting_an_impossible_layout_adopts_no_instance():
    host, _ = host_create(name="liar")
    agent = SimAgent(["h100-sxm5-80gb"], seed=13)
    hello = agent.hello()
    gpu = hello["gpus"][0]
    gpu["mig_mode_current"] = True
    gpu["mig_instances"] = [
        {
            "gpu_instance_id": 1,
            "compute_instance_id": 0,
            "profile_id": 19,
            "start": 0,
            "size": 1,
            "uuid": "MIG-1",
            "memory_mib": 9728,
        },
        {  # a placement this profile does not have
            "gpu_instance_id": 2,
            "compute_instance_id": 0,
            "profile_id": 9,
            "start": 2,
            "size": 4,
            "uuid": "MIG-2",
            "memory_mib": 40000,
        },
    ]
    gpus_adopt(host=host, gpus=protocol.validate_message(hello)["gpus"])  # type: ignore[typeddict-item]
    assert not Partition.objects.filter(gpu__host=host, kind="mig").exists()
