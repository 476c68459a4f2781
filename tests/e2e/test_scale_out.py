"""Scale out with the existing engines: two ASGI servers and two Celery workers on one
PostgreSQL and one Redis. An agent on one server and a browser on the other each see the
other's changes."""

from __future__ import annotations

import json
import time

import pytest
from websockets.sync.client import connect

from tests.e2e.stack import launched, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def two_of_everything(tmp_path_factory):
    with launched(tmp_path_factory.mktemp("scale-out"), servers=2, workers=2) as stack:
        yield stack


def frames(ws, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            yield json.loads(ws.recv(timeout=max(0.05, deadline - time.monotonic())))
        except TimeoutError:
            return


def test_an_agent_on_one_server_and_a_browser_on_the_other_see_each_others_changes(
    two_of_everything,
):
    stack = two_of_everything
    _, server_b = stack.urls  # the agent uses the first server
    agent = stack.add_agent("node-a", ["h100-sxm5-80gb"])  # connects to server A
    (gpu,) = stack.gpus(agent)
    cookie = stack.browser_session(server_b)
    ws_url = server_b.replace("http://", "ws://") + "/ws/fleet/"
    with connect(
        ws_url, additional_headers={"Cookie": cookie, "Origin": server_b}, open_timeout=10
    ) as ws:
        hello = json.loads(ws.recv(timeout=10))
        assert hello["type"] == "hello"
        # The agent's telemetry, received by server A, reaches the browser on server B.
        seen = next((f for f in frames(ws, 10) if str(gpu["id"]) in f.get("telemetry", {})), None)
        assert seen is not None, "no telemetry from the agent on the other server"
        # A change made through server B reaches the agent on server A, and its outcome comes back.
        status, op = stack.request(
            "PUT",
            f"/api/v1/gpus/{gpu['id']}/layout",
            {"mode": "mig", "instances": [{"profile": "3g.40gb", "start": 4}]},
            base=server_b,
        )
        assert status == 202, op
        changed_ops: set[int] = set()
        for frame in frames(ws, 20):
            changed_ops.update(frame.get("changed", {}).get("operation", []))
            if op["id"] in changed_ops and stack.operation(op["id"])["status"] == "succeeded":
                break
        assert op["id"] in changed_ops
    assert stack.wait_operation(op["id"])["status"] == "succeeded"
    wait_until(
        lambda: stack.converged(gpu["id"]), 20, what="the agent on server A applying the change"
    )
