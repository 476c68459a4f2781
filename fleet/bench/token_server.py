"""The test workload of ``bench_endpoints``: an HTTP server whose service time follows each
request's token counts, standard library only (run as a file by any ``python3``, no Fleet import).

``GET /generate?context=C&generated=G`` sleeps ``(C + G) / TOKENS_PER_MS`` milliseconds (1 ms per
10 tokens) and answers ``200`` with a small JSON body; ``X-Service-Ms`` says how long the handler
took and ``X-Replica`` which copy answered. ``GET /health`` answers at once. HTTP/1.1 with
keep-alive, one thread per connection. ``CONCURRENCY`` (environment, default 0: no limit) bounds
how many ``/generate`` requests it serves at once, as a model server's batch does: the others
wait in its queue (``X-Service-Ms`` counts the wait).

On SIGTERM it stops accepting connections, closes the idle ones, lets every request in flight
finish (its answer says ``Connection: close``) and exits 0: what a model server that is stopped
gracefully does. It listens on ``127.0.0.1:$FLEET_PORT_HTTP`` (the host port the agent gives the
replica), else ``$PORT``, else the first argument.

Usage: ``python3 token_server.py [PORT]``; ``VERSION`` (environment) is echoed in the answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

TOKENS_PER_MS = 10.0
MAX_SERVICE_S = 30.0
VERSION = os.environ.get("VERSION", "1")
REPLICA = f"{socket.gethostname()}:{os.getpid()}"
CONCURRENCY = int(os.environ.get("CONCURRENCY", "0") or 0)
SLOTS = threading.BoundedSemaphore(CONCURRENCY) if CONCURRENCY > 0 else None


class Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() waits for the requests in flight
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, Handler)
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.idle: dict[socket.socket, bool] = {}  # connection -> waiting for its next request

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a reset connection (a balancer's TCP check, a caller gone) is not an error

    def set_idle(self, connection: socket.socket, idle: bool) -> None:
        with self.lock:
            self.idle[connection] = idle

    def forget(self, connection: socket.socket) -> None:
        with self.lock:
            self.idle.pop(connection, None)

    def close_idle(self) -> None:
        """Wake the threads that wait for a next request on a kept-alive connection: they end."""
        with self.lock:
            idle = [c for c, waiting in self.idle.items() if waiting]
        for connection in idle:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        super().setup()
        # The headers and the body are two writes: without this, Nagle's algorithm holds the
        # body until the client's delayed ACK (40 ms on Linux).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.set_idle(self.connection, True)

    def finish(self) -> None:
        self.server.forget(self.connection)
        super().finish()

    def handle_one_request(self) -> None:
        self.server.set_idle(self.connection, True)
        if self.server.stopping.is_set():
            self.close_connection = True
            return
        super().handle_one_request()

    def parse_request(self) -> bool:
        self.server.set_idle(self.connection, False)
        return super().parse_request()

    def do_GET(self) -> None:
        started = time.monotonic()
        url = urlsplit(self.path)
        if url.path == "/health":
            self._answer(200, {"ok": True}, started)
            return
        if url.path != "/generate":
            self._answer(404, {"code": "not_found"}, started)
            return
        query = parse_qs(url.query)
        try:
            context = int(query.get("context", ["0"])[0])
            generated = int(query.get("generated", ["0"])[0])
        except ValueError:
            self._answer(400, {"code": "bad_tokens"}, started)
            return
        tokens = max(0, context) + max(0, generated)
        service_s = min(tokens / TOKENS_PER_MS / 1000.0, MAX_SERVICE_S)
        if SLOTS is None:
            time.sleep(service_s)
        else:
            with SLOTS:
                time.sleep(service_s)
        self._answer(200, {"tokens": tokens, "version": VERSION, "replica": REPLICA}, started)

    def _answer(self, status: int, body: dict[str, object], started: float) -> None:
        raw = json.dumps(body).encode()
        closing = self.server.stopping.is_set()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("X-Replica", REPLICA)
        self.send_header("X-Service-Ms", f"{(time.monotonic() - started) * 1000:.3f}")
        if closing:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: object) -> None:
        return


def listen_port(argv: list[str]) -> int:
    for name in ("FLEET_PORT_HTTP", "PORT"):
        if os.environ.get(name, "").isdecimal():
            return int(os.environ[name])
    if len(argv) > 1 and argv[1].isdecimal():
        return int(argv[1])
    raise SystemExit("token_server: no port (FLEET_PORT_HTTP, PORT or the first argument)")


def main(argv: list[str]) -> int:
    server = Server(("127.0.0.1", listen_port(argv)))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    serving.start()
    stop.wait()
    server.stopping.set()
    server.shutdown()  # no new connection is accepted
    serving.join()
    server.socket.close()
    server.close_idle()
    server.server_close()  # joins the connection threads: the requests in flight finish
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
