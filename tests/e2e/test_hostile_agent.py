"""One hostile agent beside honest ones, through the real processes (daphne, a Celery worker and
beat, Redis, PostgreSQL, ``fleet-agent`` processes): for 20 s it sends everything the protocol
refuses (infinite and huge numbers, deep nesting, malformed placements, duplicate GPUs, junk,
hellos in a loop), reconnecting whenever it is cut off. The honest hosts stay ``ready``, no
honest replica moves, their telemetry keeps flowing, and the dashboard renders for a viewer."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections import Counter
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from hostagent import protocol
from tests.agent_sim import SimAgent
from tests.e2e.stack import Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ATTACK_S = 20.0


@pytest.fixture(scope="module")
def fleet(stack: Stack) -> dict[str, Any]:
    honest = [stack.add_agent(f"honest-{n}", ["a30-24gb", "a30-24gb"]) for n in "ab"]
    for agent in honest:
        for gpu in stack.gpus(agent):
            status, op = stack.request(
                "PUT", f"/api/v1/gpus/{gpu['id']}/layout", {"mode": "mps", "mps": {}}
            )
            assert status == 202, op
            assert stack.wait_operation(op["id"])["status"] == "succeeded"
    status, deployment = stack.request(
        "POST",
        "/api/v1/deployments/",
        {"name": "asr", "kind": "mps", "memory_mib": 4096, "replicas": 4, "auto": True},
    )
    assert status == 201, deployment
    wait_until(
        lambda: (
            [a["state"] for a in stack.get("/api/v1/allocations/")["results"]] == ["active"] * 4
        ),
        60,
        what="four active replicas",
    )
    status, host = stack.request("POST", "/api/v1/hosts/", {"name": "hostile"}, token="admin")
    assert status == 201, host
    status, enrolled = _post(
        stack.url + protocol.ENROLL_PATH,
        {"enrollment_token": host["enrollment_token"], "hostname": "hostile"},
    )
    assert status == 201, enrolled
    return {"honest": honest, "token": enrolled["token"], "host_id": host["id"]}


def _post(url: str, body: Any) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read())


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def _attack_frames(agent: SimAgent) -> list[str]:
    """What the hostile agent sends, in a loop: every kind of malformed message."""
    hello = dict(agent.hello())
    hello["hostname"] = "hostile"
    uuid = hello["gpus"][0]["uuid"]
    tick = json.loads(json.dumps(agent.telemetry()))
    frames = [json.dumps(hello)]  # one honest hello first: the host gets a GPU of its own
    huge = json.loads(json.dumps(tick))
    huge["gpus"][0]["utilization_gpu_percent"] = 1e308
    frames.append(json.dumps(huge))
    nested = json.loads(json.dumps(tick))
    nested["gpus"][0]["x"] = _deep(300)  # orjson writes at most 254 levels
    frames.append(json.dumps(nested))
    twice = json.loads(json.dumps(tick))
    twice["gpus"] = twice["gpus"] * 50
    frames.append(json.dumps(twice))
    bad_hello = json.loads(json.dumps(hello))
    gpu = bad_hello["gpus"][0]
    gpu["possible_placements"] = {
        "x": {**next(iter(gpu["possible_placements"].values())), "placements": [[0]]}
    }
    frames.append(json.dumps(bad_hello))
    many = json.loads(json.dumps(hello))
    many["gpus"] = [{**gpu, "uuid": f"GPU-fake-{i}", "index": i} for i in range(200)]
    frames.append(json.dumps(many))
    frames.append("{" * 5000)
    frames.append(json.dumps({"type": "telemetry", "ts": time.time() + 10 * 86400, "gpus": []}))
    frames.append(json.dumps({**tick, "ts": -1}))
    frames.append(json.dumps({"type": "event", "kind": "xid", "gpu_uuid": uuid}))
    frames.append(json.dumps(hello))  # hellos in a loop
    return frames


def _attack(url: str, token: str, frames: list[str], until: float, sent: Counter[str]) -> None:
    ws_url = url.replace("http://", "ws://") + protocol.WS_PATH
    headers = {protocol.AUTH_HEADER: protocol.auth_header_value(token)}
    while time.monotonic() < until:
        try:
            with connect(ws_url, additional_headers=headers, open_timeout=5) as ws:
                sent["connections"] += 1
                while time.monotonic() < until:
                    for frame in frames:
                        ws.send(frame)
                        sent["messages"] += 1
                    time.sleep(0.05)
        except (ConnectionClosed, InvalidStatus, OSError, TimeoutError):
            sent["cut_off"] += 1
            time.sleep(0.1)


def _refused(stack: Stack) -> dict[str, int]:
    text = urllib.request.urlopen(
        urllib.request.Request(
            stack.url + "/metrics",
            headers={"Authorization": f"Token {stack.operator_token}", "Accept": "text/plain"},
        ),
        timeout=10,
    ).read()
    pattern = r'fleet_agent_messages_refused_total\{host="hostile",reason="(\w+)"\} ([0-9.e+]+)'
    return {m[0]: int(float(m[1])) for m in re.findall(pattern, text.decode())}


def _placement(stack: Stack) -> list[tuple[str, int, int]]:
    rows = stack.get("/api/v1/allocations/")["results"]
    return sorted((a["deployment_name"], a["replica"], a["gpu"]) for a in rows)


def test_a_hostile_agent_for_20_s_costs_the_honest_hosts_nothing(fleet, stack: Stack):
    honest_names = {"honest-a", "honest-b"}
    before = _placement(stack)
    moves_before = stack.get("/api/v1/operations/?kind=replace")["count"]
    cookie = stack.browser_session(stack.url)
    frames = _attack_frames(SimAgent(["a30-24gb"], seed=77))
    sent: Counter[str] = Counter()
    until = time.monotonic() + ATTACK_S
    attacker = threading.Thread(
        target=_attack, args=(stack.url, fleet["token"], frames, until, sent), daemon=True
    )
    attacker.start()
    statuses: Counter[str] = Counter()
    stale_s = 0.0
    pages = []
    while attacker.is_alive():
        hosts = stack.get("/api/v1/hosts/")["results"]
        for host in hosts:
            if host["name"] in honest_names:
                statuses[host["status"]] += 1
        gpus = stack.get("/api/v1/gpus/?mode=mps")["results"]
        for gpu in gpus:
            if gpu["host_name"] in honest_names and gpu.get("last_telemetry_at"):
                age = time.time() - _ts(gpu["last_telemetry_at"])
                stale_s = max(stale_s, age)
        page = urllib.request.Request(stack.url + "/", headers={"Cookie": cookie})
        with urllib.request.urlopen(page, timeout=10) as response:
            pages.append(response.status)
        time.sleep(1.0)  # one sample a second while the attack runs (a rate, not a wait)
    attacker.join()
    refused = _refused(stack)
    result = {
        "attack_s": ATTACK_S,
        "hostile_messages_sent": sent["messages"],
        "hostile_connections": sent["connections"],
        "refused_by_reason": refused,
        "honest_host_status_samples": dict(statuses),
        "honest_telemetry_max_age_s": round(stale_s, 1),
        "dashboard_pages": dict(Counter(pages)),
        "replicas_moved": stack.get("/api/v1/operations/?kind=replace")["count"] - moves_before,
    }
    print(json.dumps({"measurement": "hostile_agent", **result}))
    assert set(statuses) == {"ready"}, result
    assert _placement(stack) == before, result
    assert result["replicas_moved"] == 0, result
    assert set(pages) == {200}, result
    assert stale_s < 5, result
    assert sent["messages"] > 100 and sum(refused.values()) > 50, result
    assert {"invalid", "not_json", "stale_ts"} <= set(refused), result
    # And the hostile host's own state is only what its one honest hello said.
    hostile_gpus = stack.get(f"/api/v1/gpus/?host={fleet['host_id']}")["results"]
    assert len(hostile_gpus) == 1


def _ts(value: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
