"""The browsers' socket carries no workload spec (issue 21, H2): every socket of every role gets
the same frames, so they hold only telemetry and the ids of rows that changed; the pages then
fetch what the reader may see."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from fleet.live.browser import BrowserConsumer
from tests.api.test_spec_privacy import MARKERS, two_teams
from tests.web.test_browser_socket import frames_within

pytestmark = pytest.mark.django_db(transaction=True)


def test_frames_name_the_changed_deployment_but_carry_none_of_its_spec(viewer):
    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        communicator = WebsocketCommunicator(BrowserConsumer.as_asgi(), "/ws/fleet/")
        communicator.scope["user"] = viewer
        assert (await communicator.connect())[0]
        await communicator.receive_json_from(timeout=1)  # hello
        world = await database_sync_to_async(two_teams)()  # create, place, roll out
        frames = await frames_within(communicator, 1.5)
        await communicator.disconnect()
        return frames, world

    frames, world = async_to_sync(scenario)()
    changed = {i for f in frames for i in f.get("changed", {}).get("deployment", [])}
    assert world["d"].pk in changed  # the frames did report beta-svc's changes
    raw = orjson.dumps(frames).decode()
    for marker in MARKERS:
        assert marker not in raw, marker
