from __future__ import annotations

import asyncio
import os
import signal

from websockets.asyncio.server import serve

from hostagent import protocol
from hostagent.swarm import run_swarm
from tests.hostagent import specs


def test_a_swarm_runs_one_connection_per_simulated_host():
    async def scenario():
        tokens: dict[str, str] = {}
        all_in = asyncio.Event()

        async def handler(ws):
            hello = protocol.decode(await ws.recv())
            tokens[ws.request.headers["Authorization"]] = hello["gpus"][0]["uuid"]
            if len(tokens) == 3:
                all_in.set()
            await ws.wait_closed()

        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            stop = asyncio.Event()
            hosts = [(f"t{i}", [specs.a30()]) for i in range(3)]
            task = asyncio.create_task(
                run_swarm(f"http://127.0.0.1:{port}", hosts, interval_s=0.05, stop=stop)
            )
            await asyncio.wait_for(all_in.wait(), 10)
            stop.set()
            clients = await asyncio.wait_for(task, 5)
        return tokens, clients

    tokens, clients = asyncio.run(scenario())
    assert sorted(tokens) == ["Token t0", "Token t1", "Token t2"]
    assert len(set(tokens.values())) == 3  # per-host seeds give distinct GPU UUIDs
    assert [c.connections for c in clients] == [1, 1, 1]


def test_a_swarm_agent_runs_nothing_by_default_and_its_replicas_with_a_runtime(tmp_path):
    from tests.hostagent.runtime.fakes import workload
    from tests.hostagent.runtime.kit import allocation, desired

    loop = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done"]
    seen: dict[str, list[dict]] = {"t0": [], "t1": []}
    done = asyncio.Event()

    async def handler(ws):
        token = ws.request.headers["Authorization"].split()[-1]
        hello = protocol.decode(await ws.recv())
        seen[token].append(hello)
        state = desired(hello["gpus"][0]["uuid"], 1, [allocation(7, workload(command=loop))])
        await ws.send(protocol.encode(state))
        async for text in ws:
            message = protocol.decode(text)
            seen[token].append(message)
            states = [w["state"] for w in message.get("workloads", [])]
            if token == "t1" and "running" in states:
                done.set()

    async def scenario():
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            stop = asyncio.Event()
            clients: list = []
            none_agent = asyncio.create_task(
                run_swarm(
                    f"http://127.0.0.1:{port}", [("t0", [specs.a30()])], interval_s=0.05, stop=stop
                )
            )
            process_agent = asyncio.create_task(
                run_swarm(
                    f"http://127.0.0.1:{port}",
                    [("t1", [specs.a30()])],
                    interval_s=0.05,
                    stop=stop,
                    hostname_prefix="proc",
                    runtime="process",
                    state_dir=tmp_path,
                    clients_out=clients,
                    allow_process=True,
                    process_as_agent_user=True,
                )
            )
            await asyncio.wait_for(done.wait(), 10)
            await asyncio.sleep(0.2)
            stop.set()
            await asyncio.wait_for(asyncio.gather(none_agent, process_agent), 5)
            for entry in clients[0].workloads.supervisor.runtimes["process"].find():
                os.killpg(entry.running.pid, signal.SIGKILL)

    asyncio.run(scenario())
    none_types = [m["type"] for m in seen["t0"]]
    assert seen["t0"][0]["runtime"] == "none"
    assert "ack" in none_types
    none_reports = [m for m in seen["t0"] if m["type"] == "workloads"]
    # The replica's process workload cannot run on a 'none' agent: said once, as failed.
    assert [w["state"] for m in none_reports for w in m["workloads"]] == ["failed"]
    assert seen["t1"][0]["runtime"] == "process"
    assert (seen["t0"][0]["process_runtime"], seen["t1"][0]["process_runtime"]) == (False, True)


def test_a_swarm_given_an_address_says_it_in_every_hello():
    async def scenario():
        said: list[str | None] = []
        all_in = asyncio.Event()

        async def handler(ws):
            said.append(protocol.decode(await ws.recv()).get("address"))
            if len(said) == 2:
                all_in.set()
            await ws.wait_closed()

        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            stop = asyncio.Event()
            hosts = [(f"t{i}", [specs.a30()]) for i in range(2)]
            task = asyncio.create_task(
                run_swarm(
                    f"http://127.0.0.1:{port}",
                    hosts,
                    interval_s=0.05,
                    stop=stop,
                    address="127.0.0.1",
                )
            )
            await asyncio.wait_for(all_in.wait(), 10)
            stop.set()
            await asyncio.wait_for(task, 5)
        return said

    assert asyncio.run(scenario()) == ["127.0.0.1", "127.0.0.1"]
