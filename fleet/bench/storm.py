"""What ``bench_live`` measures beyond latency: the CPU of processes that restart, the fleet's
hosts as the control plane sees them (offline ones), how fast hosts report again after every
server restarted, how fast agents were admitted, and whether any replica moved."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.bench.browsers import Browser, percentile
from fleet.bench.stack import cpu_seconds


@dataclass
class CpuMeter:
    """CPU seconds per role over a window in which processes may be replaced (a restart): the
    old ones are read just before they stop, the new ones count from their start."""

    total: dict[str, float] = field(default_factory=dict)
    each: dict[str, list[float]] = field(default_factory=dict)
    _open: dict[str, dict[int, float]] = field(default_factory=dict)

    def start(self, role: str, pids: Sequence[int], *, from_zero: bool = False) -> None:
        readings = {p: 0.0 if from_zero else cpu_seconds(p) for p in pids}
        self._open[role] = {p: c for p, c in readings.items() if c is not None}

    def stop(self, role: str) -> None:
        spent = []
        for pid, before in self._open.pop(role, {}).items():
            after = cpu_seconds(pid)
            if after is not None:
                spent.append(after - before)
        self.total[role] = self.total.get(role, 0.0) + sum(spent)
        each = self.each.setdefault(role, [])
        for i, value in enumerate(spent):
            if i < len(each):
                each[i] += value
            else:
                each.append(value)

    def percent(self, role: str, seconds: float) -> float | None:
        if role not in self.total:
            return None
        return round(self.total[role] / seconds * 100, 1)


class OfflineWatch:
    """Polls the stack's database every second: which of the run's hosts are ``offline``."""

    def __init__(self, database_url: str, host_ids: Sequence[int]) -> None:
        self.database_url = database_url
        self.host_ids = list(host_ids)
        self.ever: set[int] = set()
        self.most = 0
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="offline-watch", daemon=True)

    def start(self) -> OfflineWatch:
        self._thread.start()
        return self

    def reset(self) -> None:
        self.ever, self.most = set(), 0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            while not self._stop.wait(1.0):
                rows = conn.execute(
                    "SELECT id FROM inventory_host WHERE status = 'offline' AND id = ANY(%s)",
                    [self.host_ids],
                ).fetchall()
                offline = {int(r[0]) for r in rows}
                self.ever |= offline
                self.most = max(self.most, len(offline))
                self.polls += 1


def recovery(
    browsers: Sequence[Browser], gpus_by_host: dict[int, list[int]], since: float
) -> dict[str, Any]:
    """After every server was told to stop at ``since``: per host, when a browser first received
    a sample the host took after ``since``. Seconds after ``since`` for 99 % and 100 % of hosts
    (``None`` if some never did), and how many never did."""
    since_ms = int(since * 1000)
    per_host: list[float] = []
    for gpu_ids in gpus_by_host.values():
        first = math.inf
        for browser in browsers:
            for gpu_id in gpu_ids:
                for ts_ms, received in browser.received.get(gpu_id, {}).items():
                    if ts_ms >= since_ms:
                        first = min(first, received)
        per_host.append(first - since)
    missing = sum(1 for v in per_host if v == math.inf)
    done = [v for v in per_host if v != math.inf]
    hosts = len(per_host)
    return {
        "p99_s": _seconds(percentile(per_host, 99)) if hosts else None,
        "all_s": None if missing else _seconds(max(done, default=0.0)),
        "p50_s": _seconds(percentile(per_host, 50)) if hosts else None,
        "not_reporting": missing,
    }


def admitted(stats: list[dict[str, Any]], since: float) -> dict[str, Any]:
    """Per agent, its first socket opened at or after ``since``: seconds after ``since`` for
    99 % and 100 % of them, and how many were never admitted."""
    firsts = []
    for stat in stats:
        for host in stat["hosts"]:
            opened = [t for t in host.get("connected_at", []) if t >= since]
            firsts.append(min(opened) - since if opened else math.inf)
    missing = sum(1 for v in firsts if v == math.inf)
    return {
        "p99_s": _seconds(percentile(firsts, 99)) if firsts else None,
        "all_s": None if missing or not firsts else _seconds(max(firsts)),
        "never": missing,
    }


def closes(stats: list[dict[str, Any]], code: int) -> int:
    """How many agents had a socket closed with ``code`` (e.g. 4429: as abusive)."""
    return sum(
        1 for stat in stats for host in stat["hosts"] if host.get("closes", {}).get(str(code))
    )


def moved(
    before: dict[int, tuple[int | None, int | None, str]],
    after: dict[int, tuple[int | None, int | None, str]],
) -> int:
    """Replicas placed before that are gone, released or on another slice after."""
    count = 0
    for allocation_id, (gpu, partition, _) in before.items():
        now = after.get(allocation_id)
        if now is None or now[:2] != (gpu, partition) or now[2] == "released":
            count += 1
    return count


def _seconds(value: float | None) -> float | None:
    if value is None or value == math.inf:
        return None
    return round(value, 1)
