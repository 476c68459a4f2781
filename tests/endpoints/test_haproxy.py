"""The gateway's HAProxy driver against a real HAProxy (Debian's haproxy 2.6) on loopback, with
plain HTTP servers as the copies: routes by host and path prefix, servers added, drained and
deleted over the Runtime API with no reload, and no request failing while they change."""

from __future__ import annotations

import http.client
import http.server
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.endpoints.haproxy import config as hconfig
from fleet.endpoints.haproxy.runtime import RuntimeApi, RuntimeApiError, servers_state
from fleet.endpoints.haproxy.sync import Route, Server, plan, sync

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = pytest.mark.skipif(
    not Path(HAPROXY).exists(), reason="needs Debian's haproxy (apt-get install haproxy)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Listener(http.server.ThreadingHTTPServer):
    # A deep backlog: this process's threads share one GIL with the callers, and a full
    # backlog (5 by default) would fail HAProxy's checks, not the gateway.
    request_queue_size = 128

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # HAProxy's TCP checks connect and reset: not an error


class Copy:
    """A copy of a model server: answers its name, after ``delay_s``."""

    def __init__(self, name: str, delay_s: float = 0.0) -> None:
        copy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                time.sleep(copy.delay_s)
                body = copy.answer(self.path, self.headers.get("X-Forwarded-Prefix", "")).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                copy.served += 1

            def log_message(self, *args: object) -> None:
                pass

        self.name, self.delay_s, self.served = name, delay_s, 0
        self.echo = False
        self.server = Listener(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str, prefix: str) -> str:
        return f"{self.name} {path} {prefix}" if self.echo else self.name

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway() -> Iterator[tuple[hconfig.GatewayConfig, RuntimeApi]]:
    # A short directory: a UNIX socket's path holds at most 107 bytes.
    directory = Path(tempfile.mkdtemp(prefix="fgw-"))
    config = hconfig.GatewayConfig(
        listen=f"127.0.0.1:{free_port()}", directory=directory, slots=4, metrics=None
    )
    hconfig.write(config)
    check = subprocess.run([HAPROXY, "-c", "-q", "-f", str(config.config_file)], check=False)
    assert check.returncode == 0
    process = subprocess.Popen(
        [HAPROXY, "-W", "-f", str(config.config_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    api = RuntimeApi(config.socket)
    deadline = time.monotonic() + 10
    while True:
        try:
            api.command("show", "info")
            break
        except RuntimeApiError:
            assert time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.05)
    yield config, api
    process.terminate()
    process.wait(10)
    shutil.rmtree(directory, ignore_errors=True)


def get(config: hconfig.GatewayConfig, path: str, host: str = "x") -> tuple[int, str]:
    request = urllib.request.Request(f"http://{config.listen}{path}", headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_configuration_is_valid_for_haproxy_and_bad_settings_are_refused(tmp_path):
    config = hconfig.GatewayConfig(listen="0.0.0.0:8080", directory=tmp_path / "gw", slots=2)
    hconfig.write(config)
    text = config.config_file.read_text()
    assert "backend ep_0" in text and "backend ep_1" in text and "backend ep_2" not in text
    assert "prometheus-exporter" in text
    for bad in (
        {"listen": "8080"},
        {"listen": "0.0.0.0:80 ssl crt /x"},
        {"slots": 0},
        {"directory": Path("/tmp/a b")},
    ):
        with pytest.raises(hconfig.ConfigError):
            hconfig.GatewayConfig(**{"listen": "127.0.0.1:1", "directory": tmp_path, **bad})


def test_a_word_that_could_become_a_second_command_is_never_sent(tmp_path):
    api = RuntimeApi(tmp_path / "none.sock")
    for word in ("a;shutdown", "a b", "a\nb", "a#b", "a\\b", ""):
        with pytest.raises(RuntimeApiError, match="not a word"):
            api.command("show", word)


def test_routes_by_host_and_path_prefix_and_an_unknown_one_is_a_json_404(gateway):
    config, api = gateway
    a, b = Copy("a"), Copy("b")
    a.echo = b.echo = True
    try:
        routes = [
            Route(0, "qwen.fleet.example", "/qwen", (Server("r1", "127.0.0.1", a.port),)),
            Route(1, None, "/llama", (Server("r2", "127.0.0.1", b.port),)),
        ]
        result = sync(api, config, routes)
        assert not result.errors, result.errors
        assert get(config, "/qwen/v1/completions") == (200, "a /v1/completions /qwen")
        assert get(config, "/qwen2/v1") == (404, get(config, "/mistral")[1])  # whole segments
        assert get(config, "/anything", host="QWEN.fleet.example:8080") == (200, "a /anything ")
        assert get(config, "/llama?q=1") == (200, "b /?q=1 /llama")
        status, body = get(config, "/mistral")
        assert status == 404 and '"endpoint.not_found"' in body
        # A second run finds nothing to do: HAProxy already holds the routes.
        assert sync(api, config, routes).commands == []
        assert (config.paths_map.read_text()) == "llama ep_1\nqwen ep_0\n"
    finally:
        a.stop()
        b.stop()


def test_copies_come_drain_and_go_with_no_failed_request_and_no_reload(gateway):
    config, api = gateway
    pid = api.command("show", "info")
    old, new = Copy("old", delay_s=0.02), Copy("new", delay_s=0.02)
    failures: list[str] = []
    answers: list[str] = []
    stop = threading.Event()
    t0 = time.monotonic()

    def caller() -> None:
        while not stop.is_set():
            status, body = get(config, "/m")
            (answers if status == 200 else failures).append(
                body if status == 200 else f"{status} at {time.monotonic() - t0:.2f}"
            )

    try:
        sync(api, config, [Route(0, None, "/m", (Server("r1", "127.0.0.1", old.port),))])
        callers = [threading.Thread(target=caller) for _ in range(4)]
        for t in callers:
            t.start()
        time.sleep(0.3)
        # Make before break: the new copy joins, the old one drains, then goes.
        both = (
            Server("r1", "127.0.0.1", old.port, draining=True),
            Server("r2", "127.0.0.1", new.port),
        )
        settle(api, config, [Route(0, None, "/m", both)])
        time.sleep(0.3)
        served_while_draining = old.served
        time.sleep(0.3)
        assert old.served <= served_while_draining + 4  # only what was in flight finished
        result = sync(api, config, [Route(0, None, "/m", (both[1],))])
        assert not result.errors, result.errors
        old.stop()
        time.sleep(0.3)
    finally:
        stop.set()
        for t in callers:
            t.join()
        new.stop()
    assert failures == []
    assert answers and answers[-1] == "new" and "old" in answers
    assert [s.name for s in servers_state(api) if s.backend == "ep_0"] == ["r2"]
    # Same process throughout: nothing was reloaded.
    assert _field(api.command("show", "info"), "Pid") == _field(pid, "Pid")


def test_a_server_deleted_while_it_holds_a_connection_waits_in_drain(gateway):
    config, api = gateway
    slow = Copy("slow", delay_s=1.5)
    try:
        sync(api, config, [Route(0, None, "/s", (Server("r1", "127.0.0.1", slow.port),))])
        answer: list[tuple[int, str]] = []
        request = threading.Thread(target=lambda: answer.append(get(config, "/s")))
        request.start()
        time.sleep(0.5)
        result = sync(api, config, [])
        assert result.waiting == 1 and not result.errors
        (state,) = [s for s in servers_state(api) if s.backend == "ep_0"]
        assert state.drain
        request.join()
        assert answer == [(200, "slow")]  # the request in flight finished
        assert sync(api, config, []).waiting == 0
        assert [s for s in servers_state(api) if s.backend == "ep_0"] == []
    finally:
        slow.stop()


def test_the_plan_adds_before_routing_and_unroutes_before_deleting(tmp_path):
    config = hconfig.GatewayConfig(listen="127.0.0.1:1", directory=tmp_path, slots=2)
    commands, _, _ = plan(
        config, [Route(1, "h.example", None, (Server("r5", "::1", 9000),))], [], {}, {}, {}
    )
    assert commands[0] == ("add", "server", "ep_1/r5", "[::1]:9000", "check")
    assert commands[-1] == ("add", "map", str(config.hosts_map), "h.example", "ep_1")


def settle(api: RuntimeApi, config: hconfig.GatewayConfig, routes: list[Route]) -> None:
    """Sync until nothing waits, as the gateway's loop does."""
    deadline = time.monotonic() + 10
    while not sync(api, config, routes).settled:
        assert time.monotonic() < deadline, "the gateway did not settle"
        time.sleep(0.1)


def _field(info: str, name: str) -> str:
    return next(
        line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith(name)
    )


def test_a_copy_leaves_the_rotation_only_once_a_copy_that_stays_is_up(tmp_path):
    from fleet.endpoints.haproxy.runtime import ServerState

    config = hconfig.GatewayConfig(listen="127.0.0.1:1", directory=tmp_path, slots=1)
    old = ServerState("ep_0", "r1", "127.0.0.1", 9001, up=True, maint=False, drain=False)
    new = ServerState("ep_0", "r2", "127.0.0.1", 9002, up=False, maint=False, drain=False)
    route = Route(
        0,
        None,
        "/m",
        (Server("r1", "127.0.0.1", 9001, draining=True), Server("r2", "127.0.0.1", 9002)),
    )
    paths = {"m": "ep_0"}
    commands, _, deferred = plan(config, [route], [old, new], {}, paths, {})
    assert (commands, deferred) == ([], 1)  # r2 has not passed its first check: r1 serves on
    up = ServerState("ep_0", "r2", "127.0.0.1", 9002, up=True, maint=False, drain=False)
    commands, _, deferred = plan(config, [route], [old, up], {}, paths, {})
    assert (commands, deferred) == ([("set", "server", "ep_0/r1", "state", "drain")], 0)
    # The last copy of all drains at once: nothing else would take its place.
    last = Route(0, None, "/m", (Server("r1", "127.0.0.1", 9001, draining=True),))
    commands, _, deferred = plan(config, [last], [old], {}, paths, {})
    assert (commands, deferred) == ([("set", "server", "ep_0/r1", "state", "drain")], 0)


def test_a_copy_that_dies_unannounced_costs_no_request(gateway):
    """A copy's process killed (its port refuses connections) before its checks or Fleet notice:
    each refused connection is retried on another copy (``retry-on conn-failure`` with
    ``option redispatch``), so no caller sees it."""
    config, api = gateway
    alive, doomed = Copy("alive", delay_s=0.005), Copy("doomed", delay_s=0.005)
    failures: list[str] = []
    answers: list[str] = []
    stop = threading.Event()

    def caller() -> None:
        while not stop.is_set():
            status, body = get(config, "/m")
            (answers if status == 200 else failures).append(body if status == 200 else str(status))

    servers = (Server("r1", "127.0.0.1", alive.port), Server("r2", "127.0.0.1", doomed.port))
    settle(api, config, [Route(0, None, "/m", servers)])
    callers = [threading.Thread(target=caller) for _ in range(4)]
    try:
        for t in callers:
            t.start()
        time.sleep(0.3)
        doomed.stop()  # no sync: HAProxy learns it from the traffic
        time.sleep(0.5)  # shorter than its checks' fall (2 x 1 s)
    finally:
        stop.set()
        for t in callers:
            t.join()
        alive.stop()
    assert failures == []
    assert "doomed" in answers and answers[-1] == "alive"


def test_a_drained_copy_that_serves_nothing_goes_to_maintenance_and_back(tmp_path):
    from fleet.endpoints.haproxy.runtime import ServerState

    config = hconfig.GatewayConfig(listen="127.0.0.1:1", directory=tmp_path, slots=1)
    paths = {"m": "ep_0"}
    going = Route(0, None, "/m", (Server("r1", "127.0.0.1", 9001, draining=True),))
    drained = ServerState("ep_0", "r1", "127.0.0.1", 9001, up=True, maint=False, drain=True)
    maint = ServerState("ep_0", "r1", "127.0.0.1", 9001, up=True, maint=True, drain=False)
    busy = {("ep_0", "r1"): 2}
    # Still answering: it stays in drain.
    assert plan(config, [going], [drained], {}, paths, busy)[0] == []
    # Serving nothing: maintenance, which closes HAProxy's idle connections to it.
    assert plan(config, [going], [drained], {}, paths, {})[0] == [
        ("set", "server", "ep_0/r1", "state", "maint")
    ]
    # Once there, it stays (no flapping back to drain) ...
    assert plan(config, [going], [maint], {}, paths, {}) == ([], 0, 0)
    # ... until Fleet wants it again.
    back = Route(0, None, "/m", (Server("r1", "127.0.0.1", 9001),))
    assert plan(config, [back], [maint], {}, paths, {})[0] == [
        ("set", "server", "ep_0/r1", "state", "ready")
    ]


def test_a_draining_copy_holds_a_connection_exactly_while_a_request_is_in_flight(gateway):
    """What the agent's early end of a drain relies on: an open connection on the copy's port is
    a request in flight. HAProxy 2.6 keeps no idle connection to a server added at runtime
    (``show servers conn``: ``idle_lim`` 0), even for a caller that keeps its own; where one
    would be kept, maintenance closes it (the plan puts a drained copy there)."""
    from hostagent.runtime.procfs import established

    config, api = gateway
    copy = Copy("copy")
    port = copy.port
    try:
        serving = [Route(0, None, "/m", (Server("r1", "127.0.0.1", port),))]
        going = [Route(0, None, "/m", (Server("r1", "127.0.0.1", port, draining=True),))]
        sync(api, config, serving)
        caller = http.client.HTTPConnection(*config.listen.split(":"), timeout=5)
        for _ in range(3):  # a caller that keeps its connection, as most HTTP clients do
            caller.request("GET", "/m", headers={"Host": "x"})
            assert caller.getresponse().read() == b"copy"
        assert wait_for_zero(lambda: established(os.getpid(), [port]))  # nothing in flight
        copy.delay_s = 1.0
        answer: list[tuple[int, str]] = []
        request = threading.Thread(target=lambda: answer.append(get(config, "/m")))
        request.start()
        time.sleep(0.3)
        sync(api, config, going)  # drain
        sync(api, config, going)  # still serving: stays in drain
        assert established(os.getpid(), [port]) == 1  # the request in flight
        (state,) = [s for s in servers_state(api) if s.backend == "ep_0"]
        assert state.drain and not state.maint
        request.join()
        assert answer == [(200, "copy")]  # it finished
        assert wait_for_zero(lambda: established(os.getpid(), [port]))
        sync(api, config, going)  # serving nothing: maintenance
        (state,) = [s for s in servers_state(api) if s.backend == "ep_0"]
        assert state.maint
        caller.close()
    finally:
        copy.stop()


def wait_for_zero(count, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if count() == 0:
            return True
        time.sleep(0.05)
    return False
