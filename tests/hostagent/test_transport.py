"""The agent's transport keeps its tokens to its server: no TLS only on loopback (or when the
operator says ``--insecure``), and no redirect is followed, over HTTP (urllib would take the
``Authorization`` header to wherever it points) or WebSocket (the agent talks to its server
alone)."""

from __future__ import annotations

import asyncio
import threading
import urllib.error
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from websockets.exceptions import InvalidStatus

from hostagent import cli, protocol
from hostagent.client import NoRedirectConnect
from hostagent.transport import http, server_problem, ws_url


@pytest.mark.parametrize(
    "server",
    [
        "https://fleet.example",
        "wss://fleet.example:8443/prefix",
        "http://127.0.0.1:8000",
        "http://localhost:8000",
        "ws://[::1]:8000",
        "http://127.3.2.1",
    ],
)
def test_tls_or_loopback_servers_are_accepted(server):
    assert server_problem(server) is None


@pytest.mark.parametrize(
    ("server", "says"),
    [
        ("http://fleet.example", "has no TLS"),
        ("ws://10.0.0.5:8000", "has no TLS"),
        ("http://localhost.evil.example", "has no TLS"),
        ("ftp://fleet.example", "must be an https://"),
        ("fleet.example", "must be an https://"),
        ("http://", "must be an https://"),
    ],
)
def test_servers_without_tls_off_loopback_are_refused_with_a_reason(server, says):
    problem = server_problem(server)
    assert problem is not None and says in problem
    if says == "has no TLS":
        assert server_problem(server, insecure=True) is None


def test_the_agent_refuses_a_clear_text_server_at_start(tmp_path, capsys):
    code = cli.main(["--server", "http://fleet.example", "--token", "t"])
    assert code == 2
    assert "has no TLS" in capsys.readouterr().err


class _Recorder(BaseHTTPRequestHandler):
    """Answers every request with ``status`` (and ``Location`` for a redirect); records the
    Authorization header of every request it was sent."""

    protocol_version = "HTTP/1.1"  # websockets reads no HTTP/1.0 answer
    status = 200
    location = ""
    seen: list[str | None]

    def _answer(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        self.send_response(self.status)
        if self.location:
            self.send_header("Location", self.location)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def _serve(status: int, location: str = "") -> tuple[ThreadingHTTPServer, list[str | None]]:
    seen: list[str | None] = []
    handler = type("Handler", (_Recorder,), {"status": status, "location": location, "seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.fixture
def elsewhere() -> Iterator[tuple[str, list[str | None]]]:
    """Where a redirect points (another host:port): records what arrives."""
    server, seen = _serve(200)
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


@pytest.mark.parametrize("code", [301, 302, 307, 308])
def test_an_http_redirect_is_an_error_and_the_token_goes_nowhere_else(elsewhere, code):
    target, arrived = elsewhere
    server, seen = _serve(code, location=target + "/api/v1/agent/desired-state")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/api/v1/agent/desired-state"
        with pytest.raises(urllib.error.URLError, match="redirected"):
            http("GET", url, "host-token")
    finally:
        server.shutdown()
    assert seen == [protocol.auth_header_value("host-token")]
    assert arrived == []


def test_a_websocket_redirect_is_an_error_and_the_token_goes_nowhere_else(elsewhere):
    target, arrived = elsewhere
    server, seen = _serve(302, location=ws_url(target))
    url = ws_url(f"http://127.0.0.1:{server.server_address[1]}")

    async def attempt() -> None:
        headers = {protocol.AUTH_HEADER: protocol.auth_header_value("host-token")}
        async with NoRedirectConnect(url, additional_headers=headers, open_timeout=5):
            pass

    try:
        with pytest.raises(InvalidStatus):
            asyncio.run(attempt())
    finally:
        server.shutdown()
    assert len(seen) == 1 and arrived == []


def test_the_enrolment_token_may_come_from_a_file_or_standard_input(tmp_path, monkeypatch):
    secret = tmp_path / "enroll"
    secret.write_text("fle_abc123\n")
    args = cli.parser().parse_args(["--server", "https://f", "--enroll-file", str(secret)])
    assert cli.config_from_args(args, cli.AgentConfig()).enrollment_token == "fle_abc123"
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("fle_from_stdin\n"))
    args = cli.parser().parse_args(["--server", "https://f", "--enroll-file", "-"])
    assert cli.config_from_args(args, cli.AgentConfig()).enrollment_token == "fle_from_stdin"


@pytest.mark.parametrize("content", ["", "two tokens\n"])
def test_an_enrolment_file_that_is_not_one_token_is_a_clear_error(tmp_path, capsys, content):
    secret = tmp_path / "enroll"
    secret.write_text(content)
    assert cli.main(["--server", "https://f", "--enroll-file", str(secret)]) == 2
    assert "must hold the enrolment token alone" in capsys.readouterr().err
    assert cli.main(["--server", "https://f", "--enroll-file", str(tmp_path / "none")]) == 2
    assert "cannot read the enrolment token" in capsys.readouterr().err
