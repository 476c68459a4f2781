"""The agent takes a renewed host token (``host_token``): stored at once in its state file (0600),
the current connection kept, the new token presented from the next connection or request on, and
by a restarted agent, even one started with ``--token``."""

from __future__ import annotations

import asyncio
import stat
import time

import pytest

from hostagent import client as client_module
from hostagent import daemon, protocol
from hostagent.config import AgentConfig, AgentState, read_state, token_sha256, write_state
from tests.hostagent.test_client import _run_against, make_client

NEW = "flh_0123abcd_the-renewed-secret-part"


def host_token(token: str = NEW) -> protocol.HostToken:
    return {"type": "host_token", "token": token, "expires_at": time.time() + 30 * 86400}


def test_a_renewed_token_is_stored_and_used_from_the_next_connection_on(tmp_path):
    client, _ = make_client(0, tmp_path)
    auth: list[str] = []
    answered, done = asyncio.Event(), asyncio.Event()

    async def handler(ws):
        auth.append(ws.request.headers["Authorization"])
        protocol.decode(await ws.recv())  # hello
        if len(auth) > 1:
            done.set()
            await ws.wait_closed()
            return
        await ws.send(protocol.encode(host_token()))
        await ws.send(protocol.encode({"type": "ping", "nonce": "after"}))
        while True:  # the same connection goes on: the ping is answered
            message = protocol.decode(await ws.recv())
            if message["type"] == "pong" and message["nonce"] == "after":
                answered.set()
                break
        await ws.close()

    asyncio.run(_run_against(handler, client, done))
    assert answered.is_set()
    assert auth == ["Token tok", f"Token {NEW}"]
    path = tmp_path / "state.json"
    assert read_state(path).token == NEW
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not path.with_suffix(".json.tmp").exists()


def test_a_rest_agent_takes_the_token_its_report_answer_carries(tmp_path, monkeypatch):
    client, _ = make_client(9, tmp_path)
    requests: list[tuple[str, str | None]] = []

    def fake_http(method, url, token, body=None):
        requests.append((method, token))
        if method == "GET":
            return 204, None
        first = sum(1 for m, _ in requests if m == "POST") == 1
        return 200, {"accepted": 1, **({"host_token": host_token()} if first else {})}

    monkeypatch.setattr(client_module, "http", fake_http)

    async def scenario():
        await client._rest_tick(0, [])
        await client._rest_tick(1, [])

    asyncio.run(scenario())
    assert requests == [("POST", "tok"), ("GET", NEW), ("POST", NEW), ("GET", NEW)]
    assert read_state(tmp_path / "state.json").token == NEW


def test_a_malformed_renewal_is_ignored_and_the_token_kept(tmp_path, monkeypatch):
    client, _ = make_client(9, tmp_path)
    monkeypatch.setattr(
        client_module,
        "http",
        lambda method, url, token, body=None: (200, {"host_token": {"type": "host_token"}}),
    )
    assert client._post_report([]) is None
    assert client.state.token == "tok"


@pytest.mark.parametrize("given", ["flh_00000000_given", "flh_11111111_another"])
def test_an_agent_restarted_with_its_given_token_uses_the_renewed_one(tmp_path, given):
    token_file = tmp_path / "state.json"
    renewed_from = "flh_00000000_given"
    write_state(
        token_file,
        AgentState(token=NEW, applied_generation=3, given_token_sha256=token_sha256(renewed_from)),
    )
    config = AgentConfig(server="http://127.0.0.1:8000", token=given, token_file=token_file)
    state = daemon.resolve_state(config)
    if given == renewed_from:
        assert state.token == NEW and state.applied_generation == 3
    else:  # another token given: that one is the operator's word
        assert state.token == given and state.given_token_sha256 == token_sha256(given)


def test_a_restarted_agent_reads_the_renewed_token_from_its_token_file(tmp_path):
    client, _ = make_client(9, tmp_path)
    client.take_token(host_token())
    config = AgentConfig(server="http://127.0.0.1:8000", token_file=tmp_path / "state.json")
    assert daemon.resolve_state(config).token == NEW
