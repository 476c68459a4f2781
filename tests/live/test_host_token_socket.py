"""Host tokens on the agent socket: an expired token is refused at the door (cached or not), a
token close to its expiry is renewed after the hello without dropping the socket, the agent's
next socket with the new token retires the old one, and an admin's rotation reaches the
connected agent."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.utils import timezone

from fleet.agents import enrollment
from fleet.agents.enrollment import host_authenticate
from fleet.core.models import Operation, OperationKind
from fleet.core.tokens import hash_token
from fleet.inventory.models import Host
from fleet.live import admission as admission_module
from fleet.live import agent as agent_module
from fleet.live.admission import Admission
from hostagent import protocol
from tests.agent_sim import SimAgent
from tests.live.test_agent_socket import connect, enrolled_host

pytestmark = pytest.mark.django_db(transaction=True)


def run(coro):
    return async_to_sync(coro)()


def expiring_in(host: Host, delta: timedelta) -> None:
    Host.objects.filter(pk=host.pk).update(token_expires_at=timezone.now() + delta)


def test_an_expired_token_is_refused_at_the_door_like_an_unknown_one(caplog, monkeypatch):
    # The refusal is logged once per host per 5 min per process: another test's host of the
    # same id (a flushed database reuses them) must not have used this host's turn.
    monkeypatch.setattr(enrollment, "_expired_logged", {})
    host, token = enrolled_host()
    expiring_in(host, timedelta(seconds=-5))

    async def scenario():
        socket = await connect(token)
        return await socket.connect()

    with caplog.at_level(logging.WARNING, logger="fleet.agents.enrollment"):
        connected, code = run(scenario)
    assert not connected and code == protocol.CLOSE_REVOKED  # 4401, as for a wrong token
    assert "expired" in caplog.text and token not in caplog.text


def test_a_token_that_expires_while_cached_is_refused_all_the_same(monkeypatch):
    host, token = enrolled_host()
    expiring_in(host, timedelta(minutes=5))

    async def scenario():
        door = Admission(asyncio.get_running_loop())
        before = (await door.authenticate(token))[0]
        monkeypatch.setattr(admission_module, "wall_clock", lambda: 1e10)  # far in the future
        cached = token in door.cache
        after = (await door.authenticate(token))[0]  # from the cache: no lookup
        return before, cached, after

    before, cached, after = run(scenario)
    assert before is not None and cached and after is None


def test_a_token_close_to_its_expiry_is_renewed_after_hello_and_the_socket_goes_on():
    host, old = enrolled_host()
    expiring_in(host, timedelta(days=2))
    agent = SimAgent(["a30-24gb"])

    async def scenario():
        socket = await connect(old)
        assert (await socket.connect())[0]
        await socket.send_json_to(agent.hello())
        renewed = await socket.receive_json_from(timeout=5)
        # The same socket carries on: a ping is answered, nothing closes it.
        await socket.send_json_to({"type": "pong", "nonce": "n", "ts": agent.telemetry()["ts"]})
        assert await socket.receive_nothing(0.3)
        await socket.disconnect()
        return renewed

    renewed = run(scenario)
    assert renewed["type"] == "host_token"
    new = renewed["token"]
    row = Host.objects.get(pk=host.pk)
    assert row.token_hash == hash_token(new) and row.previous_token_hash == hash_token(old)
    assert Operation.objects.filter(host=host, kind=OperationKind.ROTATE_HOST_TOKEN).count() == 1

    async def restarted():
        """The agent restarted with the token it stored: admitted, and the old one retired."""
        socket = await connect(new)
        assert (await socket.connect())[0]
        await socket.send_json_to(agent.hello())
        nothing = await socket.receive_nothing(0.5)  # far from expiry: no renewal
        await socket.disconnect()
        stale = await connect(old)
        return nothing, await stale.connect()

    nothing, (connected, code) = run(restarted)
    assert nothing
    row.refresh_from_db()
    assert (row.previous_token_hash, row.previous_token_expires_at) == ("", None)
    assert not connected and code == protocol.CLOSE_REVOKED
    assert host_authenticate(old) is None and host_authenticate(new) == host


def test_a_socket_open_for_weeks_is_renewed_at_its_token_recheck(monkeypatch):
    host, old = enrolled_host()
    agent = SimAgent(["a30-24gb"])

    async def scenario():
        socket = await connect(old)
        assert (await socket.connect())[0]
        await socket.send_json_to(agent.hello())
        assert await socket.receive_nothing(0.3)  # 30 days left: nothing to renew
        await sync_to_async(expiring_in)(host, timedelta(days=1))  # ...weeks later
        monkeypatch.setattr(agent_module, "TOKEN_RECHECK_SECONDS", 0.0)
        await socket.send_json_to({"type": "pong", "nonce": "n", "ts": agent.telemetry()["ts"]})
        renewed = await socket.receive_json_from(timeout=5)
        await socket.disconnect()
        return renewed

    renewed = run(scenario)
    assert renewed["type"] == "host_token"
    assert Host.objects.get(pk=host.pk).token_hash == hash_token(renewed["token"])


def test_a_renewal_lost_on_the_way_locks_no_agent_out():
    host, old = enrolled_host()
    expiring_in(host, timedelta(days=1))
    agent = SimAgent(["a30-24gb"])

    async def scenario():
        tokens = []
        for _ in range(2):  # the first renewal never reaches the agent's state file
            socket = await connect(old)
            assert (await socket.connect())[0]
            await socket.send_json_to(agent.hello())
            tokens.append((await socket.receive_json_from(timeout=5))["token"])
            await socket.disconnect()
        return tokens

    lost, kept = run(scenario)
    assert lost != kept
    assert host_authenticate(lost) is None
    assert host_authenticate(kept) == host


def test_an_admin_rotation_is_pushed_to_the_connected_agent_which_keeps_its_socket(admin_client):
    host, old = enrolled_host()
    agent = SimAgent(["a30-24gb"])

    async def scenario():
        socket = await connect(old)
        assert (await socket.connect())[0]
        await socket.send_json_to(agent.hello())
        assert await socket.receive_nothing(0.3)
        response = await sync_to_async(admin_client.post)(f"/api/v1/hosts/{host.pk}/rotate-token")
        pushed = await socket.receive_json_from(timeout=2)
        still_open = await socket.receive_nothing(0.3)
        await socket.disconnect()
        return response, pushed, still_open

    response, pushed, still_open = run(scenario)
    assert response.status_code == 200, response.content
    assert pushed == {
        "type": "host_token",
        "token": response.json()["token"],
        "expires_at": pushed["expires_at"],
    }
    assert still_open
    assert host_authenticate(pushed["token"]) == host


def test_a_rotation_with_revoke_closes_the_socket_and_pushes_nothing(admin_client):
    host, old = enrolled_host()

    async def scenario():
        socket = await connect(old)
        assert (await socket.connect())[0]
        response = await sync_to_async(admin_client.post)(
            f"/api/v1/hosts/{host.pk}/rotate-token?revoke=true"
        )
        closed = await socket.receive_output(timeout=1)
        return response, closed

    response, closed = run(scenario)
    assert response.status_code == 200
    assert closed == {"type": "websocket.close", "code": protocol.CLOSE_REVOKED}
    assert host_authenticate(old) is None
    assert host_authenticate(response.json()["token"]) == host
