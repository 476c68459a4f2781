"""The agent against a tiny WebSocket server on 127.0.0.1 (a real socket)."""

from __future__ import annotations

import asyncio

from websockets.asyncio.server import serve

from hostagent import protocol
from hostagent.client import AgentClient, http_url, ws_url
from hostagent.collector import Collector
from hostagent.config import AgentState, read_state
from hostagent.gpu.simulated import SimulatedBackend
from hostagent.mps import MpsManager
from tests.hostagent import specs


def make_client(port: int, tmp_path, allow_mutation=True) -> tuple[AgentClient, SimulatedBackend]:
    sim = SimulatedBackend([specs.a30()], seed=3)
    sim.init()
    mps = MpsManager(sim.mps_control, tmp_path / "mps")
    collector = Collector(sim, hostname="h1", mps=mps, allow_mutation=allow_mutation)
    client = AgentClient(
        server=f"http://127.0.0.1:{port}",
        state=AgentState(token="tok"),
        backend=sim,
        collector=collector,
        mps=mps,
        allow_mutation=allow_mutation,
        interval_s=0.05,
        state_file=tmp_path / "state.json",
        seed=1,
    )
    return client, sim


def desired_state(uuid: str, generation: int) -> protocol.DesiredState:
    return {
        "type": "desired_state",
        "generation": generation,
        "gpus": {
            uuid: {
                "mode": "mig",
                "mig_enabled": True,
                "instances": [
                    {"key": "p0", "profile_id": 5, "start": 0},
                    {"key": "p1", "profile_id": 5, "start": 2},
                ],
                "mps": {
                    "enabled": False,
                    "per_instance": False,
                    "default_active_thread_percentage": None,
                    "default_pinned_mem_limit_mib": None,
                },
                "allocations": [],
            }
        },
    }


async def _scenario(tmp_path, allow_mutation=True):
    hellos, acks, kinds, auth = [], [], [], []
    second_session = asyncio.Event()

    async def handler(ws):
        auth.append(ws.request.headers["Authorization"])
        hello = protocol.decode(await ws.recv())
        hellos.append(hello)
        if len(hellos) > 1:
            kinds.append(protocol.decode(await ws.recv())["type"])
            second_session.set()
            await ws.wait_closed()
            return
        uuid = hello["gpus"][0]["uuid"]
        await ws.send(protocol.encode(desired_state(uuid, 5)))
        await ws.send(protocol.encode({"type": "ping", "nonce": "n"}))
        while len(acks) < 1 or "pong" not in kinds:
            message = protocol.decode(await ws.recv())
            kinds.append(message["type"])
            if message["type"] == "ack":
                acks.append(message)
        await ws.close()  # the server drops the agent; it must come back

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        client, sim = make_client(port, tmp_path, allow_mutation)
        stop = asyncio.Event()
        task = asyncio.create_task(client.run(stop))
        await asyncio.wait_for(second_session.wait(), 10)
        stop.set()
        await asyncio.wait_for(task, 5)
    return hellos, acks, kinds, auth, client, sim


def test_agent_sends_hello_applies_desired_state_acks_and_reconnects(tmp_path):
    hellos, acks, kinds, auth, client, _sim = asyncio.run(_scenario(tmp_path))
    assert auth == ["Token tok", "Token tok"]
    assert hellos[0]["applied_generation"] == 0
    assert hellos[0]["hostname"] == "h1" and hellos[0]["protocol"] == protocol.PROTOCOL_VERSION
    [ack] = acks
    assert (ack["generation"], ack["status"]) == (5, "applied")
    observed = ack["observed"][0]
    assert [(i["profile_id"], i["start"]) for i in observed["mig_instances"]] == [(5, 0), (5, 2)]
    assert "telemetry" in kinds and "pong" in kinds
    assert hellos[1]["applied_generation"] == 5
    assert client.connections == 2
    assert read_state(tmp_path / "state.json").applied_generation == 5


def test_agent_without_allow_mutation_refuses_and_changes_nothing(tmp_path):
    hellos, acks, _, _, _client, sim = asyncio.run(_scenario(tmp_path, allow_mutation=False))
    [ack] = acks
    assert ack["status"] == "failed"
    assert {(i["status"], i["message"]) for i in ack["items"]} == {("refused", "mutation_disabled")}
    assert sim.list_gpus()[0].mig_mode_current is False
    assert hellos[1]["applied_generation"] == 0


def test_urls_are_derived_from_the_server_base_url():
    assert ws_url("https://fleet.example/base/") == "wss://fleet.example/base/ws/agent/"
    assert ws_url("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/ws/agent/"
    assert (
        http_url("http://h:1", protocol.DESIRED_STATE_PATH)
        == "http://h:1/api/v1/agent/desired-state"
    )
