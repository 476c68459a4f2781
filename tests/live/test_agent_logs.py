"""Logs through the real agent socket: the API's request reaches the host's socket, the agent's
answer reaches the waiting API; another host's socket cannot answer it; a closed socket makes
the host unreachable at once."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from fleet.agents import logs as agent_logs
from fleet.core.errors import Conflict
from tests.agent_sim import SimAgent
from tests.api.test_logs import PROCESS
from tests.factories import allow_process
from tests.live.test_agent_socket import enrolled_host, run, said_hello

pytestmark = pytest.mark.django_db(transaction=True)


def placed_replica(host):
    from fleet.allocations.services import (
        DeploymentRequest,
        deployment_create,
        deployment_place,
    )
    from fleet.inventory.models import Gpu, Host

    # The simulated agent's hello names no runtime: say this host runs processes, as a real
    # agent's hello would (started with --allow-process-runtime), or the engine refuses a
    # process workload here (placement.runtime, placement.process_runtime); and let the
    # default team run processes (its policy).
    Host.objects.filter(pk=host.pk).update(runtime="process", process_runtime=True)
    allow_process()
    gpu = Gpu.objects.filter(host=host).order_by("index").first()
    deployment = deployment_create(
        name="worker",
        request=DeploymentRequest(kind="gpu", gpu_count=1),
        replicas=1,
        workload=PROCESS,
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)
    return deployment.allocations.get()


def _answer(request, lines, **changes):
    return {
        "type": "logs",
        "request_id": request["request_id"],
        "allocation_id": request["allocation_id"],
        "lines": lines,
        "truncated": False,
        "error": None,
        **changes,
    }


def test_the_api_asks_the_hosts_socket_and_gets_its_answer_not_another_hosts():
    host, token = enrolled_host("gpu-a")
    _, other_token = enrolled_host("gpu-b")

    async def scenario():
        agent = await said_hello(token, SimAgent(["h100-sxm5-80gb"]))
        other = await said_hello(other_token, SimAgent(["h100-sxm5-80gb"], seed=2))
        allocation = await sync_to_async(placed_replica)(host)
        asked = asyncio.ensure_future(
            sync_to_async(agent_logs.allocation_logs, thread_sensitive=False)(
                allocation_id=allocation.pk, tail=20
            )
        )
        request = await agent.receive_json_from(timeout=5)
        while request["type"] == "desired_state":  # the push of the replica, if not yet taken
            request = await agent.receive_json_from(timeout=5)
        assert request == {
            "type": "logs_request",
            "request_id": request["request_id"],
            "allocation_id": allocation.pk,
            "tail": 20,
        }
        await other.send_json_to(_answer(request, ["forged"]))  # not its host's request
        await asyncio.sleep(0.3)
        assert not asked.done()
        await agent.send_json_to(_answer(request, ["hello from the replica"], truncated=True))
        logs = await asyncio.wait_for(asked, 5)
        await other.disconnect()
        await agent.disconnect()
        return logs

    logs = run(scenario)
    assert logs.lines == ["hello from the replica"] and logs.truncated and logs.error is None


def test_once_the_socket_closes_the_host_is_unreachable_at_once():
    host, token = enrolled_host()

    async def scenario():
        agent = await said_hello(token, SimAgent(["h100-sxm5-80gb"]))
        allocation = await sync_to_async(placed_replica)(host)
        connected = await sync_to_async(agent_logs.agent_socket_connected)(host.pk)
        await agent.disconnect()
        return allocation, connected

    allocation, connected = run(scenario)
    assert connected
    with pytest.raises(Conflict) as refused:
        agent_logs.allocation_logs(allocation_id=allocation.pk, tail=5)
    assert refused.value.code == "logs.agent_unreachable"


def test_a_cache_that_cannot_be_written_costs_no_socket(monkeypatch):
    from fleet.inventory.models import Gpu
    from fleet.live import agent as consumer
    from fleet.live import presence

    def unreachable(*args):
        raise ConnectionError("Redis is restarting")

    monkeypatch.setattr(presence, "agent_sockets_open", unreachable)
    monkeypatch.setattr(consumer, "agent_socket_closed", unreachable)
    host, token = enrolled_host()

    async def scenario():
        agent = await said_hello(token, SimAgent(["h100-sxm5-80gb"]))
        await agent.disconnect()

    run(scenario)
    assert Gpu.objects.filter(host=host).count() == 1  # the hello was handled all the same
