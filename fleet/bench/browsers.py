"""``bench_live``'s browsers: WebSocket clients on ``/ws/fleet/`` that note when each GPU sample
reaches them, and the measurement of latency and drops from what they noted."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

DROP_AFTER_S = 2.0
LATE_AFTER_S = 1.0


@dataclass
class Browser:
    """One browser socket: per GPU, ``ts_ms -> first receipt time`` of every sample received."""

    url: str
    session_key: str
    received: dict[int, dict[int, float]] = field(default_factory=dict)
    frames: int = 0
    bytes: int = 0
    closed: str = ""
    connections: int = 0
    untimed: int = 0  # telemetry values without ``ts_ms`` (a server without it)
    # frames by the load level they carried (``frame.load.level``; -1: a server without it)
    load_frames: dict[int, int] = field(default_factory=dict)
    connected_at: list[float] = field(default_factory=list)

    async def run(self, ready: asyncio.Event, stop: asyncio.Event) -> None:
        """Keep the socket up until ``stop`` (reconnecting, as the dashboard does)."""
        from websockets.asyncio.client import connect

        parts = urlsplit(self.url)
        ws = f"ws://{parts.netloc}/ws/fleet/"
        headers = {"Cookie": f"sessionid={self.session_key}", "Origin": self.url}
        while not stop.is_set():
            try:
                async with connect(ws, additional_headers=headers, max_size=None) as socket_:
                    hello = json.loads(await socket_.recv())
                    if hello.get("type") != "hello":
                        raise RuntimeError(f"unexpected first frame {hello!r}")
                    self.connections += 1
                    self.connected_at.append(time.time())
                    ready.set()
                    receiver = asyncio.ensure_future(self._receive(socket_))
                    stopper = asyncio.ensure_future(stop.wait())
                    await asyncio.wait({receiver, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    for task in (receiver, stopper):
                        task.cancel()
                    await asyncio.gather(receiver, stopper, return_exceptions=True)
            except Exception as exc:
                self.closed = f"{type(exc).__name__}: {exc}"
                if not self.connections:
                    ready.set()
                    return
            if not stop.is_set():
                await asyncio.sleep(0.5)

    async def _receive(self, socket_: Any) -> None:
        async for text in socket_:
            now = time.time()
            self.bytes += len(text)
            frame = json.loads(text)
            if frame.get("type") != "frame":
                continue
            self.frames += 1
            load = frame.get("load")
            level = load.get("level", -1) if isinstance(load, dict) else -1
            self.load_frames[level] = self.load_frames.get(level, 0) + 1
            for gpu_id, values in (frame.get("telemetry") or {}).items():
                ts_ms = values.get("ts_ms") if isinstance(values, dict) else None
                if isinstance(ts_ms, int):
                    self.received.setdefault(int(gpu_id), {}).setdefault(ts_ms, now)
                else:
                    self.untimed += 1


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def update_gaps(browsers: Sequence[Browser], t0: float, t1: float) -> dict[str, Any]:
    """How long each GPU went without a new sample reaching a browser in ``[t0, t1)``: the
    longest wait per GPU and browser (counting from ``t0`` and up to ``t1``), then the p50, p99
    and max over them, in seconds."""
    gaps: list[float] = []
    for browser in browsers:
        for receipts in browser.received.values():
            times = sorted(r for r in receipts.values() if t0 <= r < t1)
            edges = [t0, *times, t1]
            gaps.append(max(b - a for a, b in itertools.pairwise(edges)))
    return {
        "p50": _round(percentile(gaps, 50)),
        "p99": _round(percentile(gaps, 99)),
        "max": _round(max(gaps) if gaps else None),
    }


def _round(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


def measure(
    *,
    browsers: Sequence[Browser],
    sent: dict[int, list[float]],
    gpus_by_host: dict[int, list[int]],
    t0: float,
    t1: float,
) -> dict[str, Any]:
    """Latency, throughput and drops of the window ``[t0, t1)`` (see the module docstring)."""
    latencies: list[float] = []
    dropped = late = received_total = sent_total = 0
    for browser in browsers:
        for host_id, gpu_ids in gpus_by_host.items():
            window = [s for s in sent.get(host_id, []) if t0 <= s < t1]
            for gpu_id in gpu_ids:
                sent_total += len(window)
                got = browser.received.get(gpu_id, {})
                keys = sorted(got)
                # suffix minimum of receipt times: the earliest arrival of this or a newer sample
                earliest = [0.0] * len(keys)
                best = math.inf
                for i in range(len(keys) - 1, -1, -1):
                    best = min(best, got[keys[i]])
                    earliest[i] = best
                for s in window:
                    i = bisect.bisect_left(keys, int(s * 1000))
                    if i >= len(keys) or earliest[i] > s + DROP_AFTER_S:
                        dropped += 1
                for ts_ms in keys:
                    ts = ts_ms / 1000
                    if t0 <= ts < t1:
                        received_total += 1
                        latency = got[ts_ms] - ts
                        latencies.append(latency)
                        late += latency > LATE_AFTER_S
    seconds = t1 - t0
    count = max(1, len(browsers))

    def ms(value: float | None) -> float | None:
        return round(value * 1000, 1) if value is not None else None

    return {
        "samples_per_s": round(received_total / count / seconds, 1),
        "sent_per_s": round(sent_total / count / seconds, 1),
        "latency_ms": {
            "p50": ms(percentile(latencies, 50)),
            "p90": ms(percentile(latencies, 90)),
            "p99": ms(percentile(latencies, 99)),
            "max": ms(max(latencies) if latencies else None),
        },
        "dropped": dropped,
        "late": late,
        "received": received_total,
        "expected": sent_total,
    }
