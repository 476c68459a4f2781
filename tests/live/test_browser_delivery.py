"""A browser socket tells its server's load monitor how late the telemetry batches reach it
(issue 28: after a restart storm the frames stayed 5-20 s late while every loop was calm)."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from fleet.core.events import FLEET_GROUP
from fleet.live.browser import BrowserConsumer
from fleet.live.load import monitor, pressed

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_batch_published_seconds_ago_is_delivery_pressure_and_still_reaches_the_browser(
    viewer,
):
    async def scenario() -> tuple[float, bool, dict]:
        communicator = WebsocketCommunicator(BrowserConsumer.as_asgi(), "/ws/fleet/")
        communicator.scope["user"] = viewer
        assert (await communicator.connect())[0]
        await communicator.receive_json_from(timeout=1)  # hello
        layer = get_channel_layer()
        for _ in range(12):
            await layer.group_send(
                FLEET_GROUP,
                {
                    "type": "live.telemetry",
                    "host_id": 1,
                    "host_ids": [1],
                    "ts": time.time() - 3,
                    "blobs": [orjson.dumps({"7": {"utilization_percent": 50}})],
                    "ids": [7],
                    "fleet": [],
                    "load": 0,
                    "sent": time.time() - 3.0,
                },
            )
        await asyncio.sleep(0.1)
        load = monitor()
        late, behind = load.pressure.delivery_s, pressed(load.pressure)
        frame = await communicator.receive_json_from(timeout=2)
        await communicator.disconnect()
        return late, behind, frame

    late, behind, frame = async_to_sync(scenario)()
    assert late > 2.5 and behind
    # Coalesced, never withheld: the browser still gets the values.
    assert frame["type"] == "frame" and frame["telemetry"]["7"]["utilization_percent"] == 50
