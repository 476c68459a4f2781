"""Mixed versions (issue 26): the server serves agents of its protocol and the one before; an
older agent, or one newer than the server, is refused at its hello with a sentence saying what
to upgrade, recorded on the host, shown on its page and raised as an alert once."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from fleet.agents.enrollment import host_issue_token
from fleet.agents.messages import handle_message
from fleet.agents.versions import UnsupportedAgent
from fleet.core.alerts import AGENT_UNSUPPORTED
from fleet.core.models import AlertDelivery, AlertWebhook
from fleet.inventory.models import Gpu, Host
from fleet.inventory.services import host_create
from hostagent import __version__, protocol
from tests.agent_sim import SimAgent
from tests.live.test_agent_socket import connect

pytestmark = pytest.mark.django_db


def test_a_server_serves_its_own_protocol_and_the_one_before_only():
    server = protocol.PROTOCOL_VERSION
    assert protocol.protocol_support(server) == "supported"
    assert protocol.protocol_support(server - 1) == "supported"
    assert protocol.protocol_support(server - 2) == "too_old"
    assert protocol.protocol_support(server + 1) == "too_new"
    assert server - 1 == protocol.OLDEST_PROTOCOL


def test_this_agent_release_is_listed_with_the_protocol_it_speaks():
    assert protocol.AGENT_RELEASES[__version__] == protocol.PROTOCOL_VERSION
    assert sorted(protocol.AGENT_RELEASES.values()) == list(protocol.AGENT_RELEASES.values())


@pytest.fixture
def host():
    host, _ = host_create(name="gpu-host")
    return host


def hello(agent_protocol: int, version: str = "9.9.9") -> protocol.Hello:
    message = SimAgent(["h100-sxm5-80gb"]).hello()
    message["protocol"] = agent_protocol
    message["agent_version"] = version
    return message


def test_an_agent_one_protocol_behind_is_served_and_its_protocol_recorded(host):
    handle_message(host.pk, hello(protocol.PROTOCOL_VERSION - 1, "0.1.0"))
    host.refresh_from_db()
    assert (host.agent_protocol, host.agent_version, host.status) == (1, "0.1.0", "ready")
    assert Gpu.objects.filter(host=host).count() == 1


@pytest.mark.parametrize(
    ("agent_protocol", "upgrade"),
    [(protocol.PROTOCOL_VERSION - 2, "upgrade the agent"), (99, "upgrade the server first")],
)
def test_an_agent_this_server_does_not_serve_is_refused_recorded_and_alerted_once(
    host, agent_protocol, upgrade
):
    AlertWebhook.objects.create(url="https://hooks.example/x", events=[AGENT_UNSUPPORTED])
    for _ in range(3):  # a reconnect loop alerts once
        with pytest.raises(UnsupportedAgent) as refused:
            handle_message(host.pk, hello(agent_protocol))
        assert refused.value.code == "agent.protocol_unsupported"
        assert refused.value.status_code == 426
        assert upgrade in refused.value.message and "9.9.9" in refused.value.message
    host.refresh_from_db()
    assert (host.agent_protocol, host.agent_version) == (agent_protocol, "9.9.9")
    assert host.status == "offline" and not Gpu.objects.filter(host=host).exists()
    (alert,) = AlertDelivery.objects.filter(event=AGENT_UNSUPPORTED)
    assert alert.payload["subject"]["host"]["name"] == "gpu-host"
    assert upgrade in alert.payload["summary"]


def test_the_host_page_and_api_say_what_to_upgrade(host, client, viewer, viewer_client):
    with pytest.raises(UnsupportedAgent):
        handle_message(host.pk, hello(99))
    body = viewer_client.get(f"/api/v1/hosts/{host.pk}/").json()
    assert body["agent_protocol"] == 99
    assert "upgrade the server first" in body["agent_problem"]
    client.force_login(viewer)
    page = client.get(f"/hosts/{host.pk}/").content.decode()
    assert 'id="host-agent-problem"' in page and "upgrade the server first" in page
    handle_message(host.pk, hello(protocol.PROTOCOL_VERSION, __version__))  # upgraded
    assert viewer_client.get(f"/api/v1/hosts/{host.pk}/").json()["agent_problem"] == ""
    assert 'id="host-agent-problem"' not in client.get(f"/hosts/{host.pk}/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_the_socket_says_why_then_closes_with_the_unsupported_protocol_code():
    host, _ = host_create(name="old-agent")
    token = host_issue_token(host)

    async def scenario():
        communicator = await connect(token)
        assert (await communicator.connect())[0]
        agent = SimAgent(["h100-sxm5-80gb"])
        await communicator.send_json_to(hello(protocol.PROTOCOL_VERSION - 2))
        # An agent sends its ticks right after its hello, before any answer: not read.
        await communicator.send_json_to(agent.telemetry())
        await communicator.send_json_to(agent.telemetry())
        error = await communicator.receive_json_from(timeout=5)
        assert error["type"] == "error" and error["code"] == "agent.protocol_unsupported"
        assert "upgrade the agent" in error["message"]
        closed = await communicator.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": protocol.CLOSE_UNSUPPORTED_PROTOCOL}
        await asyncio.sleep(1.5)  # past the presence writer's flush (about once a second)
        seen = await sync_to_async(lambda: Host.objects.get(pk=host.pk))()
        assert (seen.status, seen.last_seen_at) == ("offline", None)

    async_to_sync(scenario)()
