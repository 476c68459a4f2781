"""The sockets' telemetry batcher: ticks of many hosts become one batch and one live message,
an agent behind is re-synced through its own socket, and a failed batch never stops the next."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from fleet.agents import ingest as inventory_ingest
from fleet.agents.discovery import gpus_adopt
from fleet.core.events import FLEET_GROUP
from fleet.inventory.models import Gpu, Host
from fleet.inventory.selectors import latest_telemetry
from fleet.inventory.services import host_create
from fleet.live import ingest
from tests.agent_sim import SimAgent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("mem_store")]


def hosts(n: int) -> list[tuple[Host, SimAgent]]:
    out = []
    for i in range(n):
        host, _ = host_create(name=f"b{i}")
        agent = SimAgent(["a30-24gb"], seed=200 + i)
        gpus_adopt(host=host, gpus=agent.hello()["gpus"])
        out.append((Host.objects.get(pk=host.pk), agent))
    return out


def run(coro: Any) -> Any:
    return async_to_sync(coro)()


def test_ticks_of_many_hosts_are_one_batch_and_one_live_message():
    fleet = hosts(4)

    async def scenario() -> tuple[dict[str, Any], ingest.Batcher]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(FLEET_GROUP, channel)
        batcher = ingest.batcher()
        for host, agent in fleet:
            batcher.submit(host.pk, host.created_at.timestamp(), agent.telemetry(), lambda: None)
        await batcher.drain()
        message = await layer.receive(channel)
        return message, batcher

    message, batcher = run(scenario)
    assert batcher.batches == 1 and batcher.ticks == 4
    assert message["type"] == "live.telemetry"
    assert sorted(message["host_ids"]) == sorted(h.pk for h, _ in fleet)
    gpu_ids = list(Gpu.objects.values_list("pk", flat=True))
    live: dict[str, Any] = {}
    for blob in message["blobs"]:  # pre-encoded once for every browser
        live.update(orjson.loads(blob))
    assert sorted(int(g) for g in live) == sorted(gpu_ids) == sorted(message["ids"])
    assert all(v["health"] == "healthy" and "ts_ms" in v for v in live.values())
    assert sorted(row[0] for row in message["fleet"]) == sorted(h.pk for h, _ in fleet)
    assert sum(row[3] for row in message["fleet"]) == len(gpu_ids)
    assert set(latest_telemetry(gpu_ids)) == set(gpu_ids)


def test_an_agent_behind_is_resynced_through_its_own_socket():
    ((host, agent),) = hosts(1)
    Host.objects.filter(pk=host.pk).update(
        desired_generation=3, applied_generation=1, status="ready"
    )
    called: list[int] = []

    async def scenario() -> None:
        batcher = ingest.batcher()
        batcher.submit(
            host.pk, host.created_at.timestamp(), agent.telemetry(), lambda: called.append(1)
        )
        await batcher.drain()

    run(scenario)
    assert called == [1]


def test_a_failed_batch_is_dropped_and_the_next_one_is_stored(monkeypatch):
    ((host, agent),) = hosts(1)
    real = inventory_ingest.prepare
    calls: list[int] = []

    def flaky(ticks: Any) -> Any:
        calls.append(len(ticks))
        if len(calls) == 1:
            raise ConnectionError("redis went away")
        return real(ticks)

    monkeypatch.setattr(ingest, "prepare", flaky)

    async def scenario() -> None:
        batcher = ingest.batcher()
        created = host.created_at.timestamp()
        batcher.submit(host.pk, created, agent.telemetry(), lambda: None)
        await batcher.drain()
        batcher.submit(host.pk, created, agent.telemetry(), lambda: None)
        await batcher.drain()
        assert batcher.batches == 1  # the failed one is not counted as stored

    run(scenario)
    assert calls == [1, 1]
    gpu_ids = list(Gpu.objects.values_list("pk", flat=True))
    assert set(latest_telemetry(gpu_ids)) == set(gpu_ids)


def test_a_closed_socket_is_not_resynced():
    ((host, agent),) = hosts(1)
    Host.objects.filter(pk=host.pk).update(
        desired_generation=2, applied_generation=0, status="ready"
    )
    called: list[int] = []

    async def scenario() -> None:
        batcher = ingest.batcher()

        def resync() -> None:
            called.append(1)

        batcher.submit(host.pk, host.created_at.timestamp(), agent.telemetry(), resync)
        batcher.forget(host.pk, resync)
        await batcher.drain()

    run(scenario)
    assert called == []


def test_while_storing_is_stuck_the_queue_holds_one_tick_per_host_the_newest():
    fleet = hosts(2)

    async def scenario() -> ingest.Batcher:
        batcher = ingest.Batcher(asyncio.get_running_loop())
        batcher.task = asyncio.get_running_loop().create_future()  # a batch that never ends
        for n in range(25):
            for host, agent in fleet:
                tick = {**agent.telemetry(), "ts": float(n)}
                batcher.submit(host.pk, host.created_at.timestamp(), tick, lambda: None)
        batcher.task.cancel()
        return batcher

    batcher = run(scenario)
    assert sorted(batcher.pending) == sorted(h.pk for h, _ in fleet)
    assert batcher.coalesced == 2 * 24
    assert {t.telemetry["ts"] for t in batcher.pending.values()} == {24.0}  # the newest kept


def test_a_socket_forgets_its_resync_callback_when_it_closes():
    class Socket:
        def resync(self) -> None:
            raise AssertionError("a closed socket was re-synced")

    async def scenario() -> None:
        batcher = ingest.Batcher(asyncio.get_running_loop())
        socket = Socket()
        batcher.resync[7] = socket.resync
        batcher.forget(7, socket.resync)  # another bound-method object, the same callback
        assert 7 not in batcher.resync
        other = Socket()
        batcher.resync[7] = other.resync
        batcher.forget(7, socket.resync)  # a newer socket of the same host stays registered
        assert batcher.resync[7] == other.resync

    run(scenario)
