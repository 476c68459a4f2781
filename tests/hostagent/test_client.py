"""The agent against a tiny WebSocket server on 127.0.0.1 (a real socket)."""

from __future__ import annotations

import asyncio
import time

from websockets.asyncio.server import serve

from hostagent import daemon, protocol
from hostagent.client import AgentClient, http_url, ws_url
from hostagent.collector import Collector
from hostagent.config import AgentConfig, AgentState, read_state
from hostagent.gpu.backend import BackendError
from hostagent.gpu.simulated import SimulatedBackend
from hostagent.mps import MpsManager
from tests.hostagent import specs
from tests.hostagent.faulty import FaultyBackend, Nvml999


def make_client(
    port: int, tmp_path, allow_mutation=True, sim=None
) -> tuple[AgentClient, SimulatedBackend]:
    sim = sim or SimulatedBackend([specs.a30()], seed=3)
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
        refused: protocol.ServerError = {
            "type": "error",
            "code": "protocol.invalid",
            "message": "$.gpus[0].utilization_gpu_percent: Expected `float` <= 100.0",
            "refused": "telemetry",
        }
        await ws.send(protocol.encode(refused))  # logged by the agent, which carries on
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


async def _run_against(handler, client, done: asyncio.Event, timeout_s: float = 10) -> None:
    """Run ``client`` against a WebSocket server on 127.0.0.1 until ``done`` is set."""
    async with serve(handler, "127.0.0.1", 0) as server:
        client.server = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        stop = asyncio.Event()
        task = asyncio.create_task(client.run(stop))
        try:
            await asyncio.wait_for(done.wait(), timeout_s)
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)


def test_errors_of_the_driver_on_some_ticks_do_not_stop_the_heartbeat(tmp_path):
    sim = FaultyBackend([specs.a30()], seed=3)
    client, _ = make_client(0, tmp_path, sim=sim)
    statuses, enough = [], asyncio.Event()

    async def handler(ws):
        protocol.decode(await ws.recv())  # hello
        sim.fail("list_gpus", BackendError("Unknown Error (999)"))
        sim.fail("sample", Nvml999("Unknown Error"), RuntimeError("a bug of one tick"))
        sim.fail("wait_events", Nvml999("NVMLLibraryMismatchError"))
        async for text in ws:
            message = protocol.decode(text)
            if message["type"] == "telemetry":
                statuses.append([g["status"] for g in message["gpus"]])
                if len(statuses) >= 8:
                    enough.set()

    asyncio.run(_run_against(handler, client, enough))
    assert client.connections == 1  # the session itself never broke
    read = [s for s in statuses if s]  # a tick slower than 0.05 s sends a bare heartbeat
    assert ["unavailable"] in read and read[-1] == ["ok"]
    assert not sim.failures["sample"] and not sim.failures["wait_events"]


def test_telemetry_keeps_flowing_during_a_slow_apply(tmp_path):
    sim = FaultyBackend([specs.a30()], seed=3)
    sim.slow_create_s = 1.0  # two GPU instances: a 2 s apply, as NVML takes on a real host
    client, _ = make_client(0, tmp_path, sim=sim)
    during, acks, acked = [], [], asyncio.Event()

    async def handler(ws):
        hello = protocol.decode(await ws.recv())
        await ws.send(protocol.encode(desired_state(hello["gpus"][0]["uuid"], 5)))
        async for text in ws:
            message = protocol.decode(text)
            if message["type"] == "ack":
                acks.append(message)
                acked.set()
            elif message["type"] == "telemetry" and "create_gpu_instance" in sim.log:
                during.append(message)

    asyncio.run(_run_against(handler, client, acked))
    assert acks[0]["status"] == "applied"
    assert len(during) >= 10  # 2 s at 0.05 s: about 40 ticks, none before the fix


def test_an_unexpected_error_in_an_apply_is_acked_failed_and_the_session_carries_on(tmp_path):
    sim = FaultyBackend([specs.a30()], seed=3)
    sim.fail("set_mig_mode", RuntimeError("a bug in a driver binding"))
    client, _ = make_client(0, tmp_path, sim=sim)
    acks, ponged = [], asyncio.Event()

    async def handler(ws):
        hello = protocol.decode(await ws.recv())
        await ws.send(protocol.encode(desired_state(hello["gpus"][0]["uuid"], 5)))
        await ws.send(protocol.encode({"type": "ping", "nonce": "n"}))
        async for text in ws:
            message = protocol.decode(text)
            if message["type"] == "ack":
                acks.append(message)
            elif message["type"] == "pong" and acks:
                ponged.set()

    asyncio.run(_run_against(handler, client, ponged))
    [ack] = acks
    assert ack["status"] == "failed"
    assert any("a bug in a driver binding" in item["message"] for item in ack["items"])
    assert client.connections == 1


def test_the_rest_transport_survives_driver_errors_and_an_unreachable_server(tmp_path):
    sim = FaultyBackend([specs.a30()], seed=3)
    client, _ = make_client(9, tmp_path, sim=sim)  # port 9 (discard): connection refused
    sim.fail("list_gpus", Nvml999("Unknown Error"), BackendError("Unknown Error (999)"))
    sim.fail("sample", RuntimeError("a bug of one tick"))

    async def scenario():
        stop = asyncio.Event()
        task = asyncio.create_task(client.run_rest(stop))
        await asyncio.sleep(0.6)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    assert sim.count("sample") >= 4


def test_stopping_the_agent_waits_for_an_in_flight_apply_before_shutting_nvml_down(
    tmp_path, monkeypatch
):
    sim = FaultyBackend([specs.a30()], seed=3)
    sim.slow_create_s = 0.4
    mps = MpsManager(sim.mps_control, tmp_path / "mps")
    monkeypatch.setattr(daemon, "build_backend", lambda config: (sim, mps))

    async def scenario():
        stop = asyncio.Event()

        async def handler(ws):
            hello = protocol.decode(await ws.recv())
            await ws.send(protocol.encode(desired_state(hello["gpus"][0]["uuid"], 5)))
            while "create_gpu_instance" not in sim.log:
                await asyncio.sleep(0.01)
            stop.set()  # SIGTERM in the middle of the apply
            await ws.wait_closed()

        async with serve(handler, "127.0.0.1", 0) as server:
            config = AgentConfig(
                server=f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}",
                token="tok",
                token_file=tmp_path / "state.json",
                backend="simulated",
                allow_mutation=True,
                interval_s=0.05,
                hostname="h1",
            )
            await asyncio.wait_for(daemon.run_agent(config, stop), 10)

    asyncio.run(scenario())
    last_create = max(i for i, call in enumerate(sim.log) if call == "create_gpu_instance done")
    assert sim.count("create_gpu_instance done") == 2
    assert sim.log.index("shutdown") > last_create
    assert read_state(tmp_path / "state.json").applied_generation == 5


def test_a_logs_request_is_answered_once_with_the_same_request_id(tmp_path):
    client, _ = make_client(0, tmp_path)  # runs no workloads: the answer says so
    answers, answered = [], asyncio.Event()

    async def handler(ws):
        protocol.decode(await ws.recv())
        request: protocol.LogsRequest = {
            "type": "logs_request",
            "request_id": "req-42",
            "allocation_id": 3,
            "tail": 10,
        }
        await ws.send(protocol.encode(request))
        async for text in ws:
            message = protocol.decode(text)
            if message["type"] == "logs":
                answers.append(message)
                answered.set()

    asyncio.run(_run_against(handler, client, answered))
    assert answers == [
        {
            "type": "logs",
            "request_id": "req-42",
            "allocation_id": 3,
            "lines": [],
            "truncated": False,
            "error": "this agent runs no workloads",
        }
    ]


def test_a_flood_of_logs_requests_is_answered_busy_past_the_queue_and_holds_no_more(tmp_path):
    """40 requests at once while each read takes 0.3 s: at most LOGS_QUEUED_MAX are read or
    wait, every other one is answered "busy" at once; every request gets exactly one answer."""
    import threading

    from hostagent.client import LOGS_QUEUED_MAX
    from hostagent.runtime import Supervisor, WorkloadSync, build_runtimes
    from hostagent.runtime.sync import logs_answer

    client, sim = make_client(0, tmp_path)
    reading = {"now": 0, "most": 0}
    lock = threading.Lock()

    def slow_logs(request):  # the agent's workload side, reading slowly (a big log file, say)
        with lock:
            reading["now"] += 1
            reading["most"] = max(reading["most"], reading["now"])
        time.sleep(0.3)
        with lock:
            reading["now"] -= 1
        return logs_answer(request, ["line"], False, None)

    supervisor = Supervisor(
        build_runtimes("none", hostname="h1", state_dir=tmp_path), agent_runtime="none"
    )
    client.workloads = WorkloadSync(supervisor, sim, gpu_request=False)
    client.workloads.logs = slow_logs  # type: ignore[method-assign]
    answers: list[dict] = []
    done = asyncio.Event()

    async def handler(ws):
        protocol.decode(await ws.recv())
        for i in range(40):
            request = {"type": "logs_request", "request_id": f"r{i}", "allocation_id": 3, "tail": 5}
            await ws.send(protocol.encode(request))
        async for text in ws:
            message = protocol.decode(text)
            if message["type"] == "logs":
                answers.append(message)
                if len(answers) == 40:
                    done.set()

    asyncio.run(_run_against(handler, client, done, timeout_s=20))
    assert sorted(a["request_id"] for a in answers) == sorted(f"r{i}" for i in range(40))
    served = [a for a in answers if a["error"] is None]
    busy = [a for a in answers if a["error"] and "other logs requests" in a["error"]]
    assert len(served) == LOGS_QUEUED_MAX and len(busy) == 40 - LOGS_QUEUED_MAX
    assert reading["most"] <= 4  # LOGS_AT_ONCE
