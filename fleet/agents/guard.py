"""What one agent may send: the budget of one agent socket (or one host's REST reports).

Every message an agent sends passes :meth:`AgentGuard.admit` before any work is done for it:

* **Size.** A message over :func:`max_message_bytes` (1 MiB by default, daphne's own frame
  limit) is refused unread.
* **Shape.** :func:`hostagent.protocol.decode` checks types, ranges, caps and cross-field rules,
  and keeps only the keys the protocol knows.
* **Clock.** A ``ts`` more than a day from the server's clock is refused (``stale_ts``).
* **Rate.** Token buckets: telemetry at most 2 a second sustained (an agent ticks once a second),
  other messages (hello, ack, event, pong, logs) 5 a second with bursts of 50, and events at
  most one every 5 s per GPU with bursts of 10 (a real Xid storm repeats itself; the first
  events already cordon the GPU).
* **Abuse.** Refusals have a budget too (bursts of 30, then one a second): an agent past it is
  disconnected (:data:`hostagent.protocol.CLOSE_ABUSE`).

A refused message changes nothing: it is answered with an ``error`` frame, counted per host and
reason in ``/metrics`` and logged at most once a minute per host (:mod:`fleet.inventory.refusals`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from django.conf import settings

from fleet.core.ratelimit import TokenBucket
from hostagent import protocol

MAX_CLOCK_SKEW_S = 86_400.0
_MAX_EVENT_KEYS = 256


def max_message_bytes() -> int:
    return int(getattr(settings, "FLEET_AGENT_MAX_MESSAGE_BYTES", 1024 * 1024))


def max_gpus() -> int:
    return int(getattr(settings, "FLEET_AGENT_MAX_GPUS", protocol.MAX_GPUS_PER_HOST))


class Refused(Exception):
    """A message the control plane will not act on; ``reason`` is a :data:`REASONS` name."""

    def __init__(self, reason: str, message: str, refused: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.refused = refused

    def frame(self) -> protocol.ServerError:
        """The ``error`` frame that tells the agent."""
        return {
            "type": "error",
            "code": f"protocol.{self.reason}",
            "message": protocol.clip(self.message),
            "refused": self.refused,
        }


_REASON_OF_CODE = {"protocol.not_json": "not_json"}


def _bucket(rate: float, burst: float) -> TokenBucket:
    return TokenBucket(rate=rate, burst=burst)


@dataclass
class AgentGuard:
    """The budget of one agent socket; call from its event loop only."""

    telemetry: TokenBucket = field(default_factory=lambda: _bucket(2.0, 5.0))
    control: TokenBucket = field(default_factory=lambda: _bucket(5.0, 50.0))
    # One report carries any number of replicas: an agent that coalesces its changes (the
    # fleet-agent sends at most one every 100 ms) never comes near this.
    workloads: TokenBucket = field(default_factory=lambda: _bucket(10.0, 100.0))
    refusals: TokenBucket = field(default_factory=lambda: _bucket(1.0, 30.0))
    events: dict[str, TokenBucket] = field(default_factory=dict)

    def admit(self, raw: str | bytes, now: float | None = None) -> protocol.UpMessage:
        """The message, checked and projected, if this agent may send it now; else
        :class:`Refused`."""
        if len(raw) > max_message_bytes():
            raise Refused("too_large", f"a message is at most {max_message_bytes()} bytes")
        try:
            message = protocol.decode(raw, max_gpus=max_gpus())
        except protocol.ProtocolError as error:
            raise Refused(_REASON_OF_CODE.get(error.code, "invalid"), str(error)) from None
        up = _up(message)
        self.check_rate(up, time.monotonic() if now is None else now)
        return up

    def abusive(self, now: float | None = None) -> bool:
        """Count one refusal; whether this agent has now been refused too often."""
        return not self.refusals.take(time.monotonic() if now is None else now)

    def check_rate(self, message: protocol.UpMessage, now: float | None = None) -> None:
        """Spend this message's budget, or raise :class:`Refused` (``rate_limited``)."""
        now = time.monotonic() if now is None else now
        kind = message["type"]
        bucket = (
            self.telemetry
            if kind == "telemetry"
            else self.workloads
            if kind == "workloads"
            else self.control
        )
        if not bucket.take(now):
            raise Refused("rate_limited", f"too many {kind} messages", kind)
        if kind == "event" and not self._event_bucket(str(message["gpu_uuid"])).take(now):  # type: ignore[typeddict-item]
            raise Refused("rate_limited", "too many events for this GPU", kind)

    def _event_bucket(self, gpu_uuid: str) -> TokenBucket:
        bucket = self.events.get(gpu_uuid)
        if bucket is None:
            if len(self.events) >= _MAX_EVENT_KEYS:  # UUIDs are the agent's to make up
                self.events.clear()
            bucket = self.events[gpu_uuid] = _bucket(0.2, 10.0)
        return bucket


_REST_GUARDS: OrderedDict[int, AgentGuard] = OrderedDict()
_REST_GUARDS_MAX = 10_000
_rest_lock = threading.Lock()


def rest_guard(host_id: int) -> AgentGuard:
    """The budget of a host on the REST fallback, in this process (its requests are throttled
    per host across processes too: ``FLEET_THROTTLE_AGENT``)."""
    with _rest_lock:
        guard = _REST_GUARDS.pop(host_id, None) or AgentGuard()
        _REST_GUARDS[host_id] = guard
        while len(_REST_GUARDS) > _REST_GUARDS_MAX:
            _REST_GUARDS.popitem(last=False)
        return guard


def admit_parsed(obj: object) -> protocol.UpMessage:
    """An up-message already parsed from JSON (a REST report), checked and projected the same
    way as on a socket (the REST endpoint limits requests, not messages); else :class:`Refused`."""
    try:
        message = protocol.validate_message(obj, max_gpus=max_gpus())
    except protocol.ProtocolError as error:
        raise Refused("invalid", str(error)) from None
    return _up(message)


def _up(message: protocol.Message) -> protocol.UpMessage:
    kind = message["type"]
    if kind in protocol.DOWN_TYPES:
        raise Refused("invalid", "only agent-to-server messages", kind)
    ts = message.get("ts")
    if isinstance(ts, float) and abs(ts - time.time()) > MAX_CLOCK_SKEW_S:
        raise Refused("stale_ts", "ts is more than a day from the server's clock", kind)
    return message  # type: ignore[return-value]
