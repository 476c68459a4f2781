"""The agent socket: authentication, hello adoption, desired state down, acks completing
operations, busy partitions reported in use, telemetry and events stored."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from fleet.agents.enrollment import host_issue_token
from fleet.asgi import application
from fleet.core.models import Operation
from fleet.inventory.models import Gpu, HealthEvent, Host
from fleet.inventory.selectors import latest_telemetry
from fleet.inventory.services import host_create
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.agent_sim import SimAgent

pytestmark = pytest.mark.django_db(transaction=True)


def enrolled_host(name: str = "gpu-host") -> tuple[Host, str]:
    host, _ = host_create(name=name)
    return host, host_issue_token(host)


async def connect(token: str | None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Token {token}".encode())] if token else []
    communicator = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
    return communicator


async def said_hello(token: str, agent: SimAgent) -> WebsocketCommunicator:
    """A connected agent socket that has sent its hello and been answered with nothing."""
    communicator = await connect(token)
    connected, _ = await communicator.connect()
    assert connected
    await communicator.send_json_to(agent.hello())
    await communicator.receive_nothing(0.2)
    return communicator


async def apply_next(communicator: WebsocketCommunicator, agent: SimAgent) -> None:
    """The agent applies the desired state it is sent next and acks it."""
    await communicator.send_json_to(agent.apply(await communicator.receive_json_from(timeout=5)))
    await communicator.receive_nothing(0.3)


def run(coro):
    from asgiref.sync import async_to_sync

    return async_to_sync(coro)()


def test_a_socket_without_a_valid_host_token_is_closed():
    async def scenario():
        for token in (None, "flh_deadbeef_nope", "fla_00000000_user-token"):
            communicator = await connect(token)
            connected, code = await communicator.connect()
            assert not connected and code == 4401

    run(scenario)


async def _adopted(host: Host, count: int, within_s: float = 10.0) -> list[Gpu]:
    """The host's GPUs once its hello has been handled (at once on a quiet machine; the
    consumer may still be at it on a loaded one)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        gpus = await sync_to_async(lambda: list(Gpu.objects.filter(host=host).order_by("index")))()
        if len(gpus) >= count or asyncio.get_running_loop().time() > deadline:
            return gpus
        await asyncio.sleep(0.05)


def test_hello_adopts_gpus_then_a_layout_is_pushed_applied_and_acked():
    host, token = enrolled_host()
    agent = SimAgent(["h100-sxm5-80gb", "a30-24gb"])

    async def scenario():
        communicator = await connect(token)
        assert (await communicator.connect())[0]
        await communicator.send_json_to(agent.hello())
        await communicator.send_json_to(agent.telemetry())
        assert await communicator.receive_nothing(0.3)  # nothing to apply yet
        gpus = await _adopted(host, 2)
        assert [g.product_key for g in gpus] == ["h100-sxm5-80gb", "a30-24gb"]
        assert [g.mode for g in gpus] == ["dedicated", "dedicated"]  # adopted as found
        operation = await sync_to_async(gpu_set_layout)(
            gpu_id=gpus[0].pk,
            spec=LayoutSpec(
                mode="mig", instances=(MigInstanceSpec("3g.40gb", 4), MigInstanceSpec("1g.10gb", 0))
            ),
        )
        desired = await communicator.receive_json_from(timeout=5)
        assert desired["type"] == "desired_state" and desired["generation"] == 1
        ack = agent.apply(desired)
        assert ack["status"] == "applied", ack["items"]
        await communicator.send_json_to(ack)
        await communicator.receive_nothing(0.5)
        await communicator.disconnect(timeout=10)  # after what it sent is handled
        return operation.pk

    op_id = run(scenario)
    op = Operation.objects.get(pk=op_id)
    assert op.status == "succeeded"
    assert Host.objects.get(pk=host.pk).applied_generation == 1
    instances = {
        (i.profile_id, i.start)
        for i in agent.backend.mig_instances(agent.backend.list_gpus()[0].uuid)
    }
    assert instances == {(9, 4), (19, 0)}
    assert all(
        p.uuid.startswith("MIG-") for p in Partition.objects.filter(gpu__host=host, kind="mig")
    )
    # One tick per GPU reached the telemetry store (the hot store keeps the last hour at 1 s).
    latest = latest_telemetry(Gpu.objects.filter(host=host).values_list("pk", flat=True))
    assert len(latest) == 2


def test_an_agent_that_reconnects_behind_gets_the_current_generation():
    host, token = enrolled_host()
    agent = SimAgent(["a30-24gb"])

    async def scenario():
        communicator = await said_hello(token, agent)
        await communicator.disconnect(timeout=10)  # after what it sent is handled
        gpu = await sync_to_async(Gpu.objects.get)(host=host)
        # Changed while the agent was away: nothing can be delivered now.
        await sync_to_async(gpu_set_layout)(
            gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("4g.24gb", 0),))
        )
        communicator = await connect(token)
        await communicator.connect()
        await communicator.send_json_to(agent.hello())
        desired = await communicator.receive_json_from(timeout=5)
        await communicator.send_json_to(agent.apply(desired))
        await communicator.receive_nothing(0.3)
        await communicator.disconnect(timeout=10)  # after what it sent is handled

    run(scenario)
    assert Host.objects.get(pk=host.pk).applied_generation == 1
    assert Operation.objects.get(kind="set_layout").status == "succeeded"


def test_a_busy_partition_is_reported_in_use_and_the_operation_fails_with_the_pids():
    host, token = enrolled_host()
    agent = SimAgent(["h100-sxm5-80gb"])

    async def scenario():
        communicator = await said_hello(token, agent)
        gpu = await sync_to_async(Gpu.objects.get)(host=host)
        await sync_to_async(gpu_set_layout)(
            gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("7g.80gb", 0),))
        )
        await apply_next(communicator, agent)
        # A process nobody told Fleet about runs in the 7g instance.
        instance = agent.backend.mig_instances(gpu.uuid)[0]
        pid = agent.backend.run_process(gpu.uuid, 1024, gpu_instance_id=instance.gpu_instance_id)
        op = await sync_to_async(gpu_set_layout)(
            gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("1g.10gb", 0),))
        )
        ack = agent.apply(await communicator.receive_json_from(timeout=5))
        assert ack["status"] in ("partial", "failed")
        await communicator.send_json_to(ack)
        await communicator.receive_nothing(0.3)
        await communicator.disconnect(timeout=10)  # after what it sent is handled
        return op.pk, pid

    op_id, pid = run(scenario)
    op = Operation.objects.get(pk=op_id)
    assert op.status == "failed"
    assert "in_use" in op.reason and str(pid) in op.reason
    gpu = Gpu.objects.get(host=host)
    assert [(i.profile_id, i.start) for i in agent.backend.mig_instances(gpu.uuid)] == [(0, 0)]


def test_events_are_recorded_and_a_lost_gpu_is_marked_lost():
    host, token = enrolled_host()
    agent = SimAgent(["h100-sxm5-80gb"])

    async def scenario():
        communicator = await said_hello(token, agent)
        uuid = agent.backend.list_gpus()[0].uuid
        await communicator.send_json_to(
            {
                "type": "event",
                "kind": "gpu_lost",
                "gpu_uuid": uuid,
                "gpu_instance_id": None,
                "xid": None,
                "detail": "fell off the bus",
                "ts": time.time(),
            }
        )
        await communicator.send_json_to(
            {
                "type": "event",
                "kind": "xid",
                "gpu_uuid": uuid,
                "gpu_instance_id": None,
                "xid": 79,
                "detail": "",
                "ts": time.time(),
            }
        )
        await communicator.send_json_to({"type": "nonsense"})
        refused = await communicator.receive_json_from()
        assert refused["type"] == "error" and refused["code"] == "protocol.invalid"
        await communicator.receive_nothing(0.3)
        await communicator.disconnect(timeout=10)  # after what it sent is handled

    run(scenario)
    assert sorted(HealthEvent.objects.values_list("kind", flat=True)) == ["gpu_lost", "xid"]
    assert Gpu.objects.get(host=host).health == "lost"


def test_a_gpu_of_another_host_cannot_be_written():
    victim, _ = enrolled_host("victim")
    attacker, token = enrolled_host("attacker")
    agent = SimAgent(["a30-24gb"], seed=7)
    victim_agent = SimAgent(["a30-24gb"], seed=7)  # same seed: the same GPU UUID
    from fleet.agents.discovery import agent_hello

    agent_hello(host=victim, hello=victim_agent.hello())

    async def scenario():
        communicator = await connect(token)
        await communicator.connect()
        await communicator.send_json_to(agent.hello())
        telemetry = agent.telemetry()
        await communicator.send_json_to(telemetry)
        await communicator.send_json_to(
            {
                "type": "event",
                "kind": "gpu_lost",
                "gpu_uuid": telemetry["gpus"][0]["uuid"],
                "gpu_instance_id": None,
                "xid": None,
                "detail": "",
                "ts": 1.0,
            }
        )
        await communicator.receive_nothing(0.3)
        await communicator.disconnect(timeout=10)  # after what it sent is handled

    run(scenario)
    gpu = Gpu.objects.get()
    assert gpu.host_id == victim.pk and gpu.health != "lost"
    assert latest_telemetry([gpu.pk]) == {}
    assert not Gpu.objects.filter(host=attacker).exists()
    # Its gpu_lost event was not recorded; the claim itself is, on both hosts (review L6).
    events = sorted(HealthEvent.objects.values_list("host_id", "kind"))
    assert events == sorted([(victim.pk, "gpu_conflict"), (attacker.pk, "gpu_conflict")])


def test_a_token_used_from_another_machine_is_refused():
    host, token = enrolled_host()
    Host.objects.filter(pk=host.pk).update(hostname="node-a")
    intruder = SimAgent(["a30-24gb"], seed=9)  # hostname "sim-9"

    async def scenario():
        communicator = await connect(token)
        await communicator.connect()
        await communicator.send_json_to(intruder.hello())
        output = await communicator.receive_output(timeout=2)
        assert output == {"type": "websocket.close", "code": 4403}

    run(scenario)
    assert not Gpu.objects.exists()


def test_an_agent_that_lost_its_instances_is_sent_the_layout_again():
    host, token = enrolled_host()
    agent = SimAgent(["a30-24gb"])

    async def scenario():
        communicator = await said_hello(token, agent)
        gpu = await sync_to_async(Gpu.objects.get)(host=host)
        await sync_to_async(gpu_set_layout)(
            gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("4g.24gb", 0),))
        )
        await apply_next(communicator, agent)
        await communicator.disconnect(timeout=10)  # after what it sent is handled
        # The host rebooted: MIG instances are gone, but the agent's state file says "applied 1".
        rebooted = SimAgent(["a30-24gb"])
        rebooted.applied = 1
        communicator = await connect(token)
        await communicator.connect()
        await communicator.send_json_to(rebooted.hello())
        desired = await communicator.receive_json_from(timeout=5)
        assert desired["generation"] == 1
        ack = rebooted.apply(desired)
        assert ack["status"] == "applied"
        await communicator.disconnect(timeout=10)  # after what it sent is handled
        return rebooted

    rebooted = run(scenario)
    uuid = rebooted.backend.list_gpus()[0].uuid
    assert [(i.profile_id, i.start) for i in rebooted.backend.mig_instances(uuid)] == [(0, 0)]


def test_mps_runs_only_in_the_mig_instances_that_ask_for_it():
    host, token = enrolled_host()
    agent = SimAgent(["h100-sxm5-80gb"])
    from fleet.mps import MpsPolicy

    async def scenario():
        communicator = await said_hello(token, agent)
        gpu = await sync_to_async(Gpu.objects.get)(host=host)
        layout = LayoutSpec(
            mode="mig",
            instances=(
                MigInstanceSpec("3g.40gb", 0, mps=MpsPolicy(default_active_thread_percentage=40)),
                MigInstanceSpec("3g.40gb", 4),
            ),
        )
        await sync_to_async(gpu_set_layout)(gpu_id=gpu.pk, spec=layout)
        ack = agent.apply(await communicator.receive_json_from(timeout=5))
        assert ack["status"] == "applied", ack["items"]
        await communicator.send_json_to(ack)
        await communicator.receive_nothing(0.3)
        await communicator.disconnect(timeout=10)  # after what it sent is handled
        return ack

    ack = run(scenario)
    (info,) = ack["observed"]
    daemons = {d["target_uuid"]: d for d in info["mps"]["instances"] if d["running"]}
    by_start = {i["start"]: i["uuid"] for i in info["mig_instances"]}
    assert set(daemons) == {by_start[0]}  # the 3g at slice 0 only
    assert daemons[by_start[0]]["default_active_thread_percentage"] == 40


def test_a_message_that_is_not_json_is_refused_and_the_socket_stays_up():
    host, token = enrolled_host()
    agent = SimAgent(["a30-24gb"], seed=3)

    async def scenario():
        communicator = await connect(token)
        assert (await communicator.connect())[0]
        await communicator.send_to(text_data="{not json")
        refused = await communicator.receive_json_from()
        assert refused["code"] == "protocol.not_json" and refused["refused"] is None
        await communicator.send_json_to(agent.hello())
        assert await communicator.receive_nothing(0.3)
        await communicator.disconnect(timeout=10)  # after what it sent is handled

    run(scenario)
    assert Gpu.objects.filter(host=host).count() == 1  # the hello after it was handled
