"""A fleet reconnecting at once is admitted: tokens checked a batch per query and cached, a
server past its capacity says when to come back instead of holding the handshake, an honest
agent's burst of late ticks is coalesced, never refused or called abusive, and heartbeats are
written ahead of telemetry."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.agents.enrollment import host_issue_token, hosts_authenticate
from fleet.inventory.models import Host, HostStatus
from fleet.live import admission as admission_module
from fleet.live.admission import Admission, admission
from fleet.live.load import monitor
from hostagent import protocol
from tests.agent_sim import SimAgent
from tests.live.test_agent_socket import connect, enrolled_host, said_hello

pytestmark = pytest.mark.django_db(transaction=True)


def run(coro):
    return async_to_sync(coro)()


def test_many_tokens_are_checked_in_one_query():
    hosts = [enrolled_host(f"h{i}") for i in range(5)]
    tokens = [t for _, t in hosts]
    with CaptureQueriesContext(connection) as queries:
        found = hosts_authenticate([*tokens, "flh_nope_nope", "fla_user_token"])
    assert len(queries) == 1
    assert {t: h.host_id for t, h in found.items()} == {t: h.pk for h, t in hosts}


def test_handshakes_arriving_together_share_one_lookup_and_then_the_cache(monkeypatch):
    hosts = [enrolled_host(f"h{i}") for i in range(6)]
    calls: list[int] = []
    real = admission_module.hosts_authenticate

    def counted(tokens):
        calls.append(len(tokens))
        return real(tokens)

    monkeypatch.setattr(admission_module, "hosts_authenticate", counted)

    async def scenario():
        door = Admission(asyncio.get_running_loop())
        first = await asyncio.gather(*(door.authenticate(t) for _, t in hosts))
        again = await asyncio.gather(*(door.authenticate(t) for _, t in hosts))
        unknown = await door.authenticate("flh_00000000_unknown")
        return first, again, unknown

    first, again, unknown = run(scenario)
    assert calls == [6, 1]  # one query for the six, the cache for the repeat, one for the stranger
    assert [h.host_id for h, _ in first] == [h.pk for h, _ in hosts]
    assert [h.host_id for h, _ in again] == [h.pk for h, _ in hosts]
    assert unknown[0] is None


def test_a_rotated_token_is_refused_once_the_process_forgets_it():
    host, old = enrolled_host()

    async def scenario():
        door = Admission(asyncio.get_running_loop())
        assert (await door.authenticate(old))[0] is not None
        await asyncio.to_thread(host_issue_token, host)
        cached = (await door.authenticate(old))[0]
        door.forget_host(host.pk)  # what the revoke message does on this process
        fresh = (await door.authenticate(old))[0]
        checked = (await door.authenticate(old, fresh=True))[0]
        return cached, fresh, checked

    cached, fresh, checked = run(scenario)
    assert cached is not None  # within the cache's life, at most FLEET_AGENT_AUTH_CACHE_SECONDS
    assert fresh is None and checked is None


def test_past_its_capacity_the_server_says_when_to_come_back_instead_of_holding_the_door():
    _, token = enrolled_host()

    async def scenario():
        door = admission()
        door.hellos_waiting = admission_module.HELLO_BACKLOG_MAX + 10
        try:
            socket = await connect(token)
            connected, _ = await socket.connect(timeout=2)
            later = await socket.receive_json_from(timeout=2)
            closed = await socket.receive_output(timeout=2)
        finally:
            door.hellos_waiting = 0
        return connected, later, closed

    connected, later, closed = run(scenario)
    assert connected  # accepted at once: never a handshake held until daphne's timeout
    assert later["type"] == "retry_later"
    assert admission_module.RETRY_MIN_S <= later["after_s"] <= admission_module.RETRY_MAX_S
    assert closed == {"type": "websocket.close", "code": protocol.CLOSE_RETRY_LATER}


def test_a_burst_of_late_ticks_is_coalesced_not_refused_nor_called_abusive():
    _host, token = enrolled_host()
    agent = SimAgent(["a30-24gb"])

    async def scenario():
        socket = await said_hello(token, agent)
        for _ in range(80):  # what a busy server reads at once after a stall
            await socket.send_to(text_data=json.dumps(agent.telemetry()))
        nothing = await socket.receive_nothing(1.0)
        await socket.send_json_to({"type": "pong", "nonce": "n", "ts": agent.telemetry()["ts"]})
        still = await socket.receive_nothing(0.3)
        await socket.disconnect()
        return nothing, still

    nothing, still = run(scenario)
    assert nothing and still  # no error frame, no close


def test_heartbeats_are_written_ahead_of_telemetry_and_bring_an_offline_host_back():
    host, token = enrolled_host()
    Host.objects.filter(pk=host.pk).update(status=HostStatus.OFFLINE, last_seen_at=None)
    agent = SimAgent(["a30-24gb"])

    async def scenario():
        socket = await connect(token)
        await socket.connect()
        await socket.send_json_to(agent.telemetry())  # no hello: a heartbeat all the same
        await asyncio.sleep(1.6)
        await socket.disconnect()

    run(scenario)
    host.refresh_from_db()
    assert host.status == HostStatus.READY and host.last_seen_at is not None


def test_an_agent_hears_the_pace_when_the_load_changes_and_when_it_connects_during_it():
    _, token = enrolled_host()
    agent = SimAgent(["a30-24gb"])

    async def scenario():
        socket = await said_hello(token, agent)
        load = monitor()
        load.force(2)
        try:
            pace = await socket.receive_json_from(timeout=2)
            late = await connect(token)  # a new socket replaces the first: told at once
            await late.connect()
            first = await late.receive_json_from(timeout=2)
        finally:
            load.force(0)
        back = await late.receive_json_from(timeout=2)
        load.force(None)
        await late.disconnect()
        await socket.disconnect()
        return pace, first, back

    pace, first, back = run(scenario)
    assert pace["type"] == "pace" and pace["interval_s"] >= 2.0
    assert first["type"] == "pace" and first["interval_s"] == pace["interval_s"]
    assert back["type"] == "pace" and back["interval_s"] <= 1.0  # back to its own interval
