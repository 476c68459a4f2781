from __future__ import annotations

import asyncio

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
