"""Failure logging for the agent's loops: each distinct failure at most once a minute.

A GPU that fell off the bus fails every call of every tick; logging each one would bury the log
(and the disk) in identical lines while telling the operator nothing new (review D1).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

LOG_EVERY_S = 60.0
_MAX_KEYS = 512


class FailureLog:
    """Logs a failure of ``where`` unless the same failure was logged less than ``every_s`` ago.

    Failures are the same when they happen at the same place with the same exception type and
    message. Backend errors are expected on real hosts and logged as one line; anything else is
    a bug and logged with its traceback. Thread-safe: the collector logs from worker threads.
    """

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._every_s = every_s
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def failure(self, where: str, exc: BaseException, *, expected: bool = True) -> None:
        """Log ``exc`` raised while doing ``where`` (``traceback`` too unless ``expected``)."""
        what = f"{type(exc).__name__}: {exc}"
        if self._due((where, what)):
            self._logger.warning("%s failed: %s", where, what, exc_info=None if expected else exc)

    def _due(self, key: tuple[str, str]) -> bool:
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._every_s:
                return False
            if len(self._last) >= _MAX_KEYS:  # messages with PIDs or counters never repeat
                self._last = {k: t for k, t in self._last.items() if now - t < self._every_s}
                if len(self._last) >= _MAX_KEYS:
                    self._last.clear()
            self._last[key] = now
            return True
