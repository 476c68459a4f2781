"""Rate limits that cost nothing to check: token buckets and "at most once per interval".

Pure and clock-injected (``now`` is passed in, ``time.monotonic`` by default), so they are tested
without sleeping. Not thread-safe on their own: each lives on one socket (one event loop) or
behind its owner's lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; :meth:`take` spends one."""

    rate: float
    burst: float
    tokens: float = -1.0
    at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    def take(self, now: float | None = None, cost: float = 1.0) -> bool:
        """Spend ``cost`` tokens if there are that many; whether it was allowed."""
        now = time.monotonic() if now is None else now
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False


class OncePer:
    """Answers yes at most once per ``seconds`` for each key (a log line per host a minute).

    Keeps at most ``max_keys`` keys: past that it forgets them all, which at worst lets one
    more line per key through.
    """

    def __init__(
        self,
        seconds: float,
        max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seconds = seconds
        self.max_keys = max_keys
        self.clock = clock
        self._last: dict[Hashable, float] = {}

    def __call__(self, key: Hashable) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.seconds:
            return False
        if len(self._last) >= self.max_keys:
            self._last.clear()
        self._last[key] = now
        return True


def cut(value: object, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters: what an untrusted value may put in a log
    (quoted by ``repr``, so a newline in it cannot forge a log line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
