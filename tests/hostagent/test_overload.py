"""The agent when its server is past capacity: reconnects with full-jitter backoff, comes back
when the server says (``retry_later``), reports at the pace it is asked (``pace``), and honest
ticks never trip anything (a real socket on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import itertools
import random
import time

from websockets.asyncio.server import serve

from hostagent import protocol
from hostagent.collector import ticks
from hostagent.transport import (
    BACKOFF_FLOOR_S,
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    backoff_delays,
    retry_after_delay,
)
from tests.hostagent.test_client import make_client


def test_backoff_draws_below_a_doubling_step_up_to_the_cap():
    delay = backoff_delays(random.Random(7))
    for attempt in range(20):
        step = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2**attempt)
        draws = [delay(attempt) for _ in range(200)]
        assert all(BACKOFF_FLOOR_S <= d <= step for d in draws)
        # Full jitter: the draws cover the whole step, not only its upper half.
        assert min(draws) < step * 0.25 and max(draws) > step * 0.75


def test_a_retry_after_is_honoured_with_up_to_half_as_much_again():
    rng = random.Random(3)
    draws = [retry_after_delay(8.0, rng) for _ in range(500)]
    assert all(8.0 <= d <= 12.0 for d in draws)
    assert max(draws) - min(draws) > 3.0  # spread: agents told the same do not come together
    assert retry_after_delay(10_000.0, rng) <= 900.0  # a hostile number is bounded


def test_ticks_follow_an_interval_that_changes_while_they_run():
    async def scenario() -> list[float]:
        interval = [0.02]
        stop = asyncio.Event()
        stamps: list[float] = []
        async for n in ticks(lambda: interval[0], stop):
            stamps.append(time.monotonic())
            if n == 3:
                interval[0] = 0.15
            if n == 6:
                stop.set()
        return stamps

    stamps = asyncio.run(scenario())
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert all(g < 0.1 for g in gaps[:3]) and all(g > 0.12 for g in gaps[4:])


def test_the_agent_comes_back_when_the_server_says_and_reports_at_its_pace(tmp_path):
    opened: list[float] = []
    ticks_at: list[float] = []

    async def handler(ws):
        opened.append(time.monotonic())
        if len(opened) == 1:
            later: protocol.RetryLater = {
                "type": "retry_later",
                "after_s": 0.6,
                "reason": "the server is past its capacity",
            }
            await ws.send(protocol.encode(later))
            await ws.close(protocol.CLOSE_RETRY_LATER)
            return
        protocol.decode(await ws.recv())  # hello
        pace: protocol.Pace = {"type": "pace", "interval_s": 0.3, "reason": "busy"}
        await ws.send(protocol.encode(pace))
        async for text in ws:
            if protocol.decode(text)["type"] == "telemetry":
                ticks_at.append(time.monotonic())

    async def scenario(client) -> None:
        async with serve(handler, "127.0.0.1", 0) as server:
            client.server = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            stop = asyncio.Event()
            task = asyncio.ensure_future(client.run(stop))
            await asyncio.sleep(2.4)
            stop.set()
            await task

    client, _ = make_client(0, tmp_path)
    client.interval_s = 0.05
    asyncio.run(scenario(client))
    assert client.closes.get(protocol.CLOSE_RETRY_LATER) == 1
    assert 0.6 <= opened[1] - opened[0] <= 1.2  # as told, plus jitter; not the 0.5 s backoff
    late = [b - a for a, b in itertools.pairwise(ticks_at[2:])]
    assert late and all(g > 0.2 for g in late)  # every 0.3 s, not the agent's own 0.05 s


def test_an_agent_the_server_does_not_serve_says_so_and_comes_back_rarely(tmp_path, caplog):
    opened: list[float] = []

    async def handler(ws):
        opened.append(time.monotonic())
        protocol.decode(await ws.recv())  # hello
        refused: protocol.ServerError = {
            "type": "error",
            "code": "agent.protocol_unsupported",
            "message": "upgrade the agent on this host.",
            "refused": "hello",
        }
        await ws.send(protocol.encode(refused))
        await ws.close(protocol.CLOSE_UNSUPPORTED_PROTOCOL)

    async def scenario(client) -> None:
        async with serve(handler, "127.0.0.1", 0) as server:
            client.server = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            stop = asyncio.Event()
            task = asyncio.ensure_future(client.run(stop))
            while not client.closes:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)  # the ordinary backoff would have come back by now
            stop.set()
            await task

    client, _ = make_client(0, tmp_path)
    asyncio.run(scenario(client))
    assert client.closes == {protocol.CLOSE_UNSUPPORTED_PROTOCOL: 1} and len(opened) == 1
    assert "upgrade the agent on this host." in caplog.text
    assert "does not support this agent's protocol" in caplog.text
