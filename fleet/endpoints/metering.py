"""What the gateway measures of each copy's traffic: rates from HAProxy's counters (pure).

HAProxy counts requests and 5xx answers from a server's creation (``show stat``); a rate is the
difference of two readings over the time between them, over a sliding :attr:`Meter.window_s`
(5 s by default: live, and smooth enough to scale on). A counter that went backwards (the
server was deleted and added again, or HAProxy restarted) starts a new window: no rate is
invented for the gap. ``in_flight`` and ``queued`` are read as they are now.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fleet.endpoints.haproxy.config import slot_of
from fleet.endpoints.haproxy.runtime import Counters

BACKEND = "BACKEND"


@dataclass(frozen=True)
class Sample:
    """One copy (``allocation_id``), or an endpoint's backend as a whole (``allocation_id`` 0:
    its queue holds requests no copy has taken yet), over the meter's window."""

    slot: int
    allocation_id: int
    state: str  # "ready", "draining", "down" or "maint" (HAProxy's word for the server)
    requests_per_s: float | None  # None: not yet two readings in the window
    errors_per_s: float | None
    in_flight: int
    queued: int
    response_ms: float | None  # HAProxy's average over its last 1,024 requests; None: none yet


def _state(status: str) -> str:
    word = status.split()[0].upper() if status else ""
    if word.startswith("MAINT"):
        return "maint"
    if word == "DRAIN" or word.startswith("NOLB"):
        return "draining"
    if word.startswith("DOWN"):
        return "down"
    return "ready"


def _allocation_of(server: str) -> int | None:
    """``r<allocation id>`` is how the gateway names a copy (fleet.endpoints.haproxy.sync)."""
    if server == BACKEND:
        return 0
    if server.startswith("r") and server[1:].isascii() and server[1:].isdigit():
        return int(server[1:])
    return None


@dataclass
class Meter:
    window_s: float = 5.0
    _seen: dict[tuple[str, str], deque[tuple[float, int, int]]] = field(default_factory=dict)

    def observe(self, rows: list[Counters], now: float) -> list[Sample]:
        """The samples of one reading taken at ``now`` (monotonic seconds)."""
        samples, present = [], set()
        for row in rows:
            slot, allocation_id = slot_of(row.backend), _allocation_of(row.server)
            if slot is None or allocation_id is None:
                continue  # not an endpoint's backend, or a server the gateway did not name
            key = (row.backend, row.server)
            present.add(key)
            history = self._seen.setdefault(key, deque())
            if history and (row.requests < history[-1][1] or row.errors_5xx < history[-1][2]):
                history.clear()  # a new server under an old name, or a restarted HAProxy
            history.append((now, row.requests, row.errors_5xx))
            while len(history) > 2 and now - history[1][0] >= self.window_s:
                history.popleft()
            rate = errors = None
            if len(history) > 1 and now > history[0][0]:
                span = now - history[0][0]
                rate = (row.requests - history[0][1]) / span
                errors = (row.errors_5xx - history[0][2]) / span
            samples.append(
                Sample(
                    slot=slot,
                    allocation_id=allocation_id,
                    state=_state(row.status) if allocation_id else "ready",
                    requests_per_s=rate,
                    errors_per_s=errors,
                    in_flight=row.in_flight,
                    queued=row.queued,
                    response_ms=float(row.response_ms) if row.requests else None,
                )
            )
        for gone in set(self._seen) - present:
            del self._seen[gone]
        return samples
