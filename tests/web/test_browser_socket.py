"""The browsers' socket: refuses strangers, says hello, and coalesces however many events the
fleet publishes into at most a couple of frames a second."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import orjson
import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from fleet.core.events import FLEET_GROUP
from fleet.live.browser import CLOSE_FORBIDDEN, CLOSE_UNAUTHENTICATED, BrowserConsumer

pytestmark = pytest.mark.django_db(transaction=True)


def run(coro: Any) -> Any:
    return async_to_sync(coro)()


def communicator_for(user: Any) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(BrowserConsumer.as_asgi(), "/ws/fleet/")
    communicator.scope["user"] = user
    return communicator


def telemetry(host_id: int, gpu_id: int, util: float) -> dict[str, Any]:
    return {
        "type": "live.telemetry",
        "host_id": host_id,
        "ts": 1.0,
        "gpus": {
            str(gpu_id): {
                "utilization_percent": util,
                "memory_used_mib": 1024.0,
                "memory_total_mib": 81559,
                "temperature_c": None,
                "power_w": 301.234,
                "health": "healthy",
                "partitions": {"12": {"utilization_percent": None, "memory_used_mib": 5.55}},
            }
        },
    }


async def frames_within(communicator: WebsocketCommunicator, seconds: float) -> list[dict]:
    """Every frame received in ``seconds`` (polling: a receive timeout would cancel the app)."""
    frames = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        if not await communicator.receive_nothing(timeout=0.02, interval=0.005):
            frames.append(await communicator.receive_json_from())
    return frames


def test_an_anonymous_socket_is_closed_with_4401():
    from django.contrib.auth.models import AnonymousUser

    async def scenario():
        communicator = communicator_for(AnonymousUser())
        connected, _ = await communicator.connect()
        assert connected
        closed = await communicator.receive_output(timeout=1)
        assert closed == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}

    run(scenario)


def test_a_user_without_a_role_is_closed_with_4403(django_user_model):
    user = django_user_model.objects.create_user("nobody", password="x-long-password")

    async def scenario():
        communicator = communicator_for(user)
        await communicator.connect()
        closed = await communicator.receive_output(timeout=1)
        assert closed == {"type": "websocket.close", "code": CLOSE_FORBIDDEN}

    run(scenario)


def test_a_viewer_gets_a_hello_frame(viewer):
    async def scenario():
        communicator = communicator_for(viewer)
        assert (await communicator.connect())[0]
        hello = await communicator.receive_json_from(timeout=1)
        assert hello["type"] == "hello"
        assert hello["seq"] == 0
        assert hello["role"] == "viewer" and hello["user"] == viewer.username
        await communicator.disconnect()

    run(scenario)


def test_a_burst_of_events_arrives_as_one_or_two_coalesced_frames(viewer):
    async def scenario():
        communicator = communicator_for(viewer)
        await communicator.connect()
        await communicator.receive_json_from(timeout=1)
        layer = get_channel_layer()
        for i in range(200):
            await layer.group_send(FLEET_GROUP, telemetry(1, 7 + i % 5, float(i)))
            if i % 10 == 0:
                # Let the consumer drain its channel (the in-memory layer holds 100 messages).
                await asyncio.sleep(0.002)
                await layer.group_send(
                    FLEET_GROUP, {"type": "live.changed", "kind": "gpu", "ids": [i]}
                )
        await layer.group_send(
            FLEET_GROUP, {"type": "live.changed", "kind": "operation", "ids": [3, 4]}
        )
        # Coalesced: at most one frame per flush interval (0.5 s), however many events came.
        frames = await frames_within(communicator, 2.2)
        assert 1 <= len(frames) <= 5
        assert all(f["type"] == "frame" for f in frames)
        assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
        merged_gpu_ids = {gid for f in frames for gid in f["telemetry"]}
        assert merged_gpu_ids == {"7", "8", "9", "10", "11"}
        last = {}
        for f in frames:
            last.update(f["telemetry"])
        assert last["11"]["utilization_percent"] == 199.0  # the latest value, not the first
        assert last["11"]["power_w"] == 301.234  # as published (the ingest rounds at the source)
        assert last["11"]["temperature_c"] is None  # n/a stays n/a
        changed_gpus = sorted({i for f in frames for i in f["changed"].get("gpu", [])})
        assert changed_gpus == list(range(0, 200, 10))
        assert {i for f in frames for i in f["changed"].get("operation", [])} == {3, 4}
        await communicator.disconnect()

    run(scenario)


def test_frames_are_at_least_half_a_second_apart(viewer):
    async def scenario():
        communicator = communicator_for(viewer)
        await communicator.connect()
        await communicator.receive_json_from(timeout=1)
        layer = get_channel_layer()
        loop = asyncio.get_running_loop()
        stamps = []

        async def publish_for(seconds: float) -> None:
            end = loop.time() + seconds
            n = 0
            while loop.time() < end:
                await layer.group_send(FLEET_GROUP, telemetry(1, 1, float(n)))
                n += 1
                await asyncio.sleep(0.01)

        task = asyncio.ensure_future(publish_for(1.6))
        while not task.done():
            if not await communicator.receive_nothing(timeout=0.02, interval=0.005):
                await communicator.receive_json_from()
                stamps.append(loop.time())
        await task
        await frames_within(communicator, 0.6)
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        assert len(stamps) <= 5
        assert all(gap >= 0.45 for gap in gaps), gaps
        await communicator.disconnect()

    run(scenario)


def test_a_subscription_narrows_the_telemetry_to_the_gpus_on_screen(viewer):
    async def scenario():
        communicator = communicator_for(viewer)
        await communicator.connect()
        await communicator.receive_json_from(timeout=1)
        await communicator.send_json_to({"type": "subscribe", "gpus": [2]})
        await asyncio.sleep(0.05)
        layer = get_channel_layer()
        for gpu in (1, 2, 3):
            await layer.group_send(FLEET_GROUP, telemetry(1, gpu, 50.0))
        frame = await communicator.receive_json_from(timeout=1.5)
        assert set(frame["telemetry"]) == {"2"}
        assert frame["fleet"]["reporting"] == 3  # the fleet summary still counts every GPU
        await communicator.send_json_to({"type": "ping"})
        assert (await communicator.receive_json_from(timeout=1)) == {"type": "pong"}
        await communicator.disconnect()

    run(scenario)


def test_the_asgi_route_authenticates_with_the_session_cookie(viewer, settings):
    from django.test import Client

    from fleet.asgi import application

    client = Client()
    client.force_login(viewer)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()

    async def scenario():
        communicator = WebsocketCommunicator(
            application,
            "/ws/fleet/",
            headers=[(b"cookie", cookie), (b"origin", ORIGIN), (b"host", b"testserver")],
        )
        assert (await communicator.connect())[0]
        hello = await communicator.receive_json_from(timeout=1)
        assert hello["type"] == "hello" and hello["user"] == viewer.username
        await communicator.disconnect()

        stranger = WebsocketCommunicator(
            application, "/ws/fleet/", headers=[(b"origin", ORIGIN), (b"host", b"testserver")]
        )
        await stranger.connect()
        assert (await stranger.receive_output(timeout=1))["code"] == CLOSE_UNAUTHENTICATED

    run(scenario)


def test_a_frame_of_many_gpus_is_split_so_no_message_nears_the_websocket_limit(viewer, monkeypatch):
    one = telemetry(1, 0, 10.0)["gpus"]["0"]
    part = len(orjson.dumps({"0": one}))
    monkeypatch.setattr(BrowserConsumer, "PART_GPUS", 1)
    monkeypatch.setattr(BrowserConsumer, "MAX_FRAME_BYTES", 3 * part + 10)

    async def scenario():
        communicator = communicator_for(viewer)
        await communicator.connect()
        await communicator.receive_json_from(timeout=1)
        layer = get_channel_layer()
        event = telemetry(1, 0, 10.0)
        event["gpus"] = {str(g): dict(one) for g in range(8)}
        await layer.group_send(FLEET_GROUP, event)
        await layer.group_send(FLEET_GROUP, {"type": "live.changed", "kind": "gpu", "ids": [5]})
        frames = await frames_within(communicator, 1.0)
        assert [len(f["telemetry"]) for f in frames[:3]] == [3, 3, 2]
        assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))  # no gap
        assert {g for f in frames for g in f["telemetry"]} == {str(g) for g in range(8)}
        # ``changed`` rides one frame only (the first of a split one)
        assert [f["changed"] for f in frames if f["changed"]] == [{"gpu": [5]}]
        await communicator.disconnect()

    run(scenario)


def blobs_event(host_id: int, values: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A ``live.telemetry`` as the agent sockets' batcher publishes it: pre-encoded values."""
    return {
        "type": "live.telemetry",
        "host_id": host_id,
        "host_ids": [host_id],
        "ts": 1.0,
        "blobs": [orjson.dumps(values)],
        "ids": [int(k) for k in values],
        "fleet": [[host_id, 30.0, 2, len(values)]],
        **extra,
    }


def test_pre_encoded_values_reach_the_browser_spliced_newest_last(viewer):
    one = telemetry(1, 0, 10.0)["gpus"]["0"]

    async def scenario():
        communicator = communicator_for(viewer)
        await communicator.connect()
        await communicator.receive_json_from(timeout=1)
        layer = get_channel_layer()
        await layer.group_send(FLEET_GROUP, blobs_event(1, {"5": {**one, "ts_ms": 1}}))
        await layer.group_send(
            FLEET_GROUP, blobs_event(1, {"5": {**one, "ts_ms": 2}, "6": one}, load=2)
        )
        await layer.group_send(FLEET_GROUP, blobs_event(2, {"9": one}))
        frames = await frames_within(communicator, 1.2)
        seen: dict[str, Any] = {}
        for frame in frames:
            seen.update(frame["telemetry"])
        assert set(seen) == {"5", "6", "9"}
        assert seen["5"]["ts_ms"] == 2  # the newest of the two
        assert frames[-1]["fleet"] == {"utilization_percent": 15.0, "reporting": 3}
        assert frames[-1]["load"]["level"] == 2
        assert frames[-1]["load"]["telemetry_interval_s"] > 1
        await communicator.send_json_to({"type": "subscribe", "gpus": [6]})
        await asyncio.sleep(0.05)
        await layer.group_send(FLEET_GROUP, blobs_event(1, {"5": one, "6": {**one, "ts_ms": 7}}))
        await layer.group_send(FLEET_GROUP, blobs_event(3, {"11": one}))
        frames = await frames_within(communicator, 1.2)
        assert [f["telemetry"] for f in frames] == [{"6": {**one, "ts_ms": 7}}]
        await communicator.disconnect()

    run(scenario)


def signed_in_socket(user: Any, session_key: str = "") -> WebsocketCommunicator:
    """A browser socket as the ASGI stack builds it: the user and the session it came with."""
    from types import SimpleNamespace

    communicator = communicator_for(user)
    communicator.scope["session"] = SimpleNamespace(session_key=session_key or None)
    return communicator


def new_session_key() -> str:
    from django.contrib.sessions.backends.db import SessionStore

    store = SessionStore()
    store.create()
    return str(store.session_key)


def sign_out(user: Any, session_key: str) -> None:
    """What ``POST /logout/`` does: ``logout()`` with that session's request."""
    from django.contrib.auth import logout
    from django.contrib.sessions.backends.db import SessionStore
    from django.test import RequestFactory

    request = RequestFactory().post("/logout/")
    request.session = SessionStore(session_key=session_key)
    request.user = user
    logout(request)


async def hello(communicator: WebsocketCommunicator) -> None:
    assert (await communicator.connect())[0]
    assert (await communicator.receive_json_from(timeout=1))["type"] == "hello"


def test_signing_out_closes_that_sessions_sockets_with_4401(viewer, operator):
    from channels.db import database_sync_to_async

    async def scenario():
        laptop_key = await database_sync_to_async(new_session_key)()
        phone_key = await database_sync_to_async(new_session_key)()
        laptop_tabs = [signed_in_socket(viewer, laptop_key) for _ in range(2)]
        phone = signed_in_socket(viewer, phone_key)
        colleague = signed_in_socket(operator, await database_sync_to_async(new_session_key)())
        for socket in [*laptop_tabs, phone, colleague]:
            await hello(socket)
        await database_sync_to_async(sign_out)(viewer, laptop_key)
        for tab in laptop_tabs:
            closed = await tab.receive_output(timeout=1)
            assert closed == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}
        # The same user's other session, and other users, keep their sockets.
        assert await phone.receive_nothing(timeout=0.2)
        assert await colleague.receive_nothing(timeout=0.05)
        await phone.send_json_to({"type": "ping"})
        assert (await phone.receive_json_from(timeout=1)) == {"type": "pong"}
        await phone.disconnect()
        await colleague.disconnect()

    run(scenario)


def test_deactivating_a_user_closes_every_socket_of_theirs_with_4401(viewer):
    from channels.db import database_sync_to_async

    def deactivate() -> None:
        viewer.is_active = False
        viewer.save()

    async def scenario():
        tabs = [signed_in_socket(viewer, await database_sync_to_async(new_session_key)())]
        tabs.append(signed_in_socket(viewer))
        for tab in tabs:
            await hello(tab)
        await database_sync_to_async(deactivate)()
        for tab in tabs:
            closed = await tab.receive_output(timeout=1)
            assert closed == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}

    run(scenario)


def test_losing_every_role_closes_the_sockets_with_4403_but_a_new_role_does_not(viewer, operator):
    from channels.db import database_sync_to_async

    from fleet.core.roles import Role
    from fleet.core.services import user_create

    async def scenario():
        viewer_tab, operator_tab = signed_in_socket(viewer), signed_in_socket(operator)
        await hello(viewer_tab)
        await hello(operator_tab)
        # groups.set() removes the old group before adding the new one: that is no loss.
        await database_sync_to_async(user_create)(
            username=operator.username, password=None, role=Role.VIEWER
        )
        # The change is in the operations feed (a frame may say so), and the socket stays open.
        assert all("code" not in f for f in await frames_within(operator_tab, 0.3))
        await database_sync_to_async(viewer.groups.clear)()
        closed = await viewer_tab.receive_output(timeout=1)
        while closed["type"] == "websocket.send":  # the feed's frame may come first
            closed = await viewer_tab.receive_output(timeout=1)
        assert closed == {"type": "websocket.close", "code": CLOSE_FORBIDDEN}
        await operator_tab.disconnect()

    run(scenario)


def test_removing_a_user_from_the_group_closes_their_sockets(viewer):
    from channels.db import database_sync_to_async
    from django.contrib.auth.models import Group

    def remove_from_group() -> None:
        Group.objects.get(name="viewer").user_set.remove(viewer)

    async def scenario():
        tab = signed_in_socket(viewer)
        await hello(tab)
        await database_sync_to_async(remove_from_group)()
        closed = await tab.receive_output(timeout=1)
        assert closed == {"type": "websocket.close", "code": CLOSE_FORBIDDEN}

    run(scenario)


ORIGIN = b"http://testserver"


@pytest.mark.parametrize(
    ("origin", "host", "trusted", "opens"),
    [
        (ORIGIN, b"testserver", [], True),  # the page of this server
        (b"https://evil.example", b"testserver", [], False),  # another site, with the cookie
        (b"http://testserver.evil.example", b"testserver", [], False),
        (b"", b"testserver", [], False),  # no Origin: not a browser page
        (b"https://fleet.example", b"daphne:8000", ["https://fleet.example"], True),  # a proxy
        (b"https://a.fleet.example", b"daphne:8000", ["https://*.fleet.example"], True),
        (b"http://fleet.example", b"daphne:8000", ["https://fleet.example"], False),  # scheme
    ],
)
def test_a_browser_socket_opens_only_from_this_servers_own_or_a_trusted_origin(
    viewer, settings, origin, host, trusted, opens
):
    """Even with ``ALLOWED_HOSTS = ["*"]``, which lets Channels' own check pass any Origin."""
    from django.test import Client

    from fleet.live.routing import browser_sockets

    settings.ALLOWED_HOSTS = ["*"]
    application = browser_sockets()
    settings.CSRF_TRUSTED_ORIGINS = trusted
    client = Client()
    client.force_login(viewer)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    headers = [(b"cookie", cookie), (b"host", host)] + ([(b"origin", origin)] if origin else [])

    async def scenario():
        communicator = WebsocketCommunicator(application, "/ws/fleet/", headers=headers)
        connected, _ = await communicator.connect()
        assert connected is opens
        await communicator.disconnect()

    run(scenario)
