"""Replaying a request trace over HTTP: the arrivals of the Azure LLM inference trace (2023),
compressed in time, sent by an asyncio client that keeps its connections alive.

The trace (``AzureLLMInferenceTrace_conv.csv``: ``TIMESTAMP,ContextTokens,GeneratedTokens``, one
row per request of a production conversation service) is published by Microsoft under CC-BY 4.0
with the Splitwise paper (Patel et al., *Splitwise: Efficient Generative LLM Inference Using
Phase Splitting*, ISCA 2024).

Each request is ``GET <path>?context=C&generated=G``, sent at its arrival time on an idle
connection of the pool (a new one when none is idle), and recorded with when it was sent, how
long its answer took, its status (0: the connection failed or closed without a whole answer)
and the server's own ``X-Service-Ms``.
"""

from __future__ import annotations

import asyncio
import csv
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

TRACE = Path("/work/shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv")
MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Arrival:
    at_s: float  # seconds from the replay's start
    context: int
    generated: int


@dataclass
class Outcome:
    sent_at: float  # monotonic
    latency_ms: float
    status: int  # 0: connection failed, reset or closed before a whole answer
    service_ms: float | None = None
    error: str = ""
    replica: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def ended_at(self) -> float:
        return self.sent_at + self.latency_ms / 1000.0


def load_trace(path: Path, seconds: float, limit: int | None = None) -> list[Arrival]:
    """The first ``limit`` requests of ``path`` (all when ``None``), their arrival times scaled
    so the last arrives ``seconds`` after the first."""
    stamps: list[float] = []
    tokens: list[tuple[int, int]] = []
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if limit is not None and len(stamps) >= limit:
                break
            stamp = row["TIMESTAMP"].strip()
            # Seven fractional digits: datetime takes six.
            head, _, fraction = stamp.partition(".")
            parsed = datetime.strptime(f"{head}.{fraction[:6] or '0'}", "%Y-%m-%d %H:%M:%S.%f")
            stamps.append(parsed.timestamp())
            tokens.append((int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    if not stamps:
        raise ValueError(f"{path}: no requests")
    first, span = stamps[0], (stamps[-1] - stamps[0]) or 1.0
    scale = seconds / span
    return [Arrival((s - first) * scale, c, g) for s, (c, g) in zip(stamps, tokens, strict=True)]


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer


class Replayer:
    """Sends ``arrivals`` to ``targets`` (``(host, port, path)``; round-robin when several, as a
    client-side balancer would) and collects an :class:`Outcome` per request."""

    def __init__(self, targets: Sequence[tuple[str, int, str]], timeout_s: float = 60.0) -> None:
        self.targets = list(targets)
        self.timeout_s = timeout_s
        self.idle: dict[int, list[_Connection]] = {i: [] for i in range(len(self.targets))}
        self.outcomes: list[Outcome] = []
        self.late_ms: list[float] = []  # how far behind its arrival time each request left
        self.stale_retries = 0  # requests sent again after a kept-alive connection was closed

    async def run(self, arrivals: Sequence[Arrival]) -> list[Outcome]:
        start = time.monotonic()
        tasks = []
        for n, arrival in enumerate(arrivals):
            delay = start + arrival.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self.late_ms.append(max(0.0, -delay) * 1000.0)
            tasks.append(asyncio.create_task(self._one(n % len(self.targets), arrival)))
        await asyncio.gather(*tasks)
        for pool in self.idle.values():
            for connection in pool:
                connection.writer.close()
        return self.outcomes

    async def _one(self, target: int, arrival: Arrival) -> None:
        host, port, path = self.targets[target]
        request = (
            f"GET {path}?context={arrival.context}&generated={arrival.generated} HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\nUser-Agent: fleet-bench-endpoints\r\n\r\n"
        ).encode()
        sent = time.monotonic()
        outcome = Outcome(sent, 0.0, 0)
        pool = self.idle[target]
        # A kept-alive connection the other end closed while it sat idle fails before a byte of
        # the answer: the request (a GET) is sent again once on a new connection, as HTTP
        # clients do (RFC 9110, 9.2.2). A new connection that fails is a failed request.
        for reused in ([True] if pool else []) + [False]:
            connection = pool.pop() if reused and pool else None
            try:
                if connection is None:
                    connection = _Connection(*await asyncio.open_connection(host, port))
                connection.writer.write(request)
                status, headers, body = await asyncio.wait_for(
                    self._answer(connection.reader), self.timeout_s
                )
            except (
                OSError,
                EOFError,
                TimeoutError,
                asyncio.IncompleteReadError,
                ValueError,
            ) as exc:
                if connection is not None:
                    connection.writer.close()
                outcome.error = f"{type(exc).__name__}: {exc}"[:200]
                if reused and _before_answer(exc):
                    self.stale_retries += 1
                    continue
                break
            # An error status keeps the start of its body: whose error it was (the balancer's
            # page, the activator's JSON, the workload's).
            outcome.status = status
            outcome.error = "" if status < 400 else body[:120].decode("latin-1")
            outcome.service_ms = _float(headers.get("x-service-ms"))
            outcome.replica = headers.get("x-replica", "")
            if headers.get("connection", "").lower() == "close":
                connection.writer.close()
            else:
                pool.append(connection)
            break
        outcome.latency_ms = (time.monotonic() - sent) * 1000.0
        self.outcomes.append(outcome)

    @staticmethod
    async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > MAX_HEADER_BYTES:
            raise ValueError("answer headers too long")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise ValueError(f"not an HTTP answer: {lines[0][:60]!r}")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif "transfer-encoding" in headers:
            raise ValueError("chunked answers are not read here")
        else:
            # No length: the body ends when the server closes (RFC 9112, 6.3), as busybox's
            # httpd answers a CGI script; the connection cannot be kept.
            body = b""
            while chunk := await reader.read(64 * 1024):
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise ValueError("answer body too long")
            headers["connection"] = "close"
        return int(parts[1]), headers, body


def replay(targets: Sequence[tuple[str, int, str]], arrivals: Sequence[Arrival]) -> Replayer:
    """Run a replay to its end, in its own event loop: the replayer holds the outcomes."""
    replayer = Replayer(targets)
    asyncio.run(replayer.run(arrivals))
    return replayer


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank), ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _before_answer(exc: BaseException) -> bool:
    """The connection ended before any byte of the answer (reset, or closed at once)."""
    if isinstance(exc, asyncio.IncompleteReadError):
        return not exc.partial
    return isinstance(exc, ConnectionError | EOFError)


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None
