"""How busy this ASGI process is, and what it does about it: graceful degradation.

A server past its capacity must shed load, never lock its door: fewer or coarser samples, while
heartbeats and desired state still go through. Each event loop measures itself
(:class:`LoadMonitor`): how late its own timers fire (**loop lag**: every handler, frame and
handshake waits that long), how stale telemetry is when its batch is taken (**backlog**), and
how much CPU the process uses. From these it keeps a **level**:

========  =====================  ===============  ===================  =================
level     agents report every    batch window     browser frames       when
========  =====================  ===============  ===================  =================
normal    their own interval     0.1 s            every 0.5 s          calm
busy      2 s                    0.5 s            every 1 s            behind for 1 s
overload  3 s                    1 s              every 1 s            still behind
========  =====================  ===============  ===================  =================

A level goes up after :data:`UP_AFTER_S` of pressure and down only after :data:`DOWN_AFTER_S`
of calm *and* when the load, scaled to the faster reporting of the level below, would still
fit (:func:`fits_below`): so the fleet does not flap between levels as coarsening relieves it.
Agents hear the level through a ``pace`` message (:mod:`fleet.live.agent`); browsers read it in
every frame (``"load"``) and the fleet view says the telemetry is delayed and coarsened.

Everything here runs on the event loop; nothing blocks, nothing touches the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)

PROBE_S = 0.2
"""How often the loop measures its own lag."""
CPU_EVERY_S = 1.0
"""How often the process's CPU use is read."""
SMOOTHING = 0.3
"""Weight of a new probe in the moving averages (about the last second counts)."""
UP_AFTER_S = 1.0
"""Pressure this long raises the level."""
DOWN_AFTER_S = 20.0
"""Calm this long (and room below) lowers it."""
SETTLE_S = 8.0
"""After a change, the agents take up to one interval to follow their new pace: the level does not
rise again before this."""

LAG_HIGH_S = 0.25
"""Loop lag past this is pressure: a handshake, a push or a frame waits that long."""
BACKLOG_HIGH_S = 1.5
"""Telemetry older than this when its batch is taken is pressure."""
CPU_HIGH = 0.92
"""A process using this share of a core has no room left (one Python process, one core)."""
LAG_CALM_S = 0.05
BACKLOG_CALM_S = 0.6
CPU_ROOM = 0.65
"""The CPU share the load may reach at the level below for the level to go down."""


@dataclass(frozen=True)
class Level:
    """What the process does at one load level."""

    number: int
    name: str
    telemetry_interval_s: float  # asked of agents; 0.1 (the protocol's minimum): their own
    batch_window_s: float
    browser_flush_s: float


NORMAL_INTERVAL_S = 0.1


def levels() -> tuple[Level, ...]:
    """The three levels, from the settings (``FLEET_LIVE_BATCH_SECONDS`` and
    ``FLEET_LIVE_DEGRADED_INTERVALS``)."""
    window = float(getattr(settings, "FLEET_LIVE_BATCH_SECONDS", 0.1))
    busy, overload = getattr(settings, "FLEET_LIVE_DEGRADED_INTERVALS", (2.0, 3.0))
    return (
        Level(0, "normal", NORMAL_INTERVAL_S, window, 0.5),
        Level(1, "busy", float(busy), max(window, 0.5), 1.0),
        Level(2, "overloaded", float(overload), max(window, 1.0), 1.0),
    )


def degrade_enabled() -> bool:
    return bool(getattr(settings, "FLEET_LIVE_DEGRADE", True))


@dataclass
class Pressure:
    """The smoothed measures the level is decided from."""

    lag_s: float = 0.0
    backlog_s: float = 0.0
    cpu: float = 0.0  # share of one core used by this process


def pressed(p: Pressure) -> bool:
    """Whether the process is behind: its loop lags, its telemetry is stale or its core full."""
    return p.lag_s > LAG_HIGH_S or p.backlog_s > BACKLOG_HIGH_S or p.cpu > CPU_HIGH


def fits_below(p: Pressure, current: Level, below: Level) -> bool:
    """Whether the load would still fit one level down: calm now, and the CPU the process uses,
    scaled to the faster reporting below, leaves room."""
    if p.lag_s > LAG_CALM_S or p.backlog_s > BACKLOG_CALM_S:
        return False
    slower = current.telemetry_interval_s
    faster = max(below.telemetry_interval_s, 1.0)  # agents tick at 1 s by default
    return p.cpu * (slower / faster) < CPU_ROOM


class LoadMonitor:
    """The load of one event loop (one ASGI process): measures, a level, and who to tell."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.table = levels()
        self.level = self.table[0]
        self.pressure = Pressure()
        self.changed_at = time.monotonic()
        self.pressed_since: float | None = None
        self.calm_since: float | None = None
        self.forced: int | None = None
        self._listeners: weakref.WeakSet[Any] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None
        self._cpu_at = (time.monotonic(), time.process_time())

    # -- what others read ----------------------------------------------------------------

    def start(self) -> None:
        """Begin probing (idempotent; the first agent socket or telemetry batch calls it)."""
        if degrade_enabled() and (self._task is None or self._task.done()):
            self._task = self.loop.create_task(self._probe())

    def summary(self) -> dict[str, Any]:
        """The level as browsers and ``/metrics`` see it."""
        return {
            "level": self.level.number,
            "name": self.level.name,
            "telemetry_interval_s": max(self.level.telemetry_interval_s, 1.0)
            if self.level.number
            else None,
            "lag_ms": round(self.pressure.lag_s * 1000),
            "backlog_ms": round(self.pressure.backlog_s * 1000),
        }

    def pace_message(self) -> dict[str, Any]:
        """The ``pace`` message for agents at the current level."""
        reason = (
            "the server is back within its capacity"
            if not self.level.number
            else f"the server is {self.level.name}: report telemetry less often"
        )
        return {
            "type": "pace",
            "interval_s": self.level.telemetry_interval_s,
            "reason": reason,
        }

    def listen(self, listener: Any) -> None:
        """``listener.load_changed(level)`` is called (on the loop) at every level change; kept
        weakly, so a closed socket needs no unsubscribe."""
        self._listeners.add(listener)

    # -- what the batcher tells it ---------------------------------------------------------

    def backlog(self, age_s: float) -> None:
        """The oldest tick of a batch was this old when the batch was taken."""
        self.pressure.backlog_s += SMOOTHING * (max(0.0, age_s) - self.pressure.backlog_s)

    # -- tests and operators ---------------------------------------------------------------

    def force(self, number: int | None) -> None:
        """Hold the level at ``number`` (``None``: measure again)."""
        self.forced = number
        if number is not None:
            self._set(self.table[max(0, min(number, len(self.table) - 1))])

    # -- the probe -------------------------------------------------------------------------

    async def _probe(self) -> None:
        while True:
            started = self.loop.time()
            await asyncio.sleep(PROBE_S)
            lag = max(0.0, self.loop.time() - started - PROBE_S)
            self.pressure.lag_s += SMOOTHING * (lag - self.pressure.lag_s)
            self._read_cpu()
            if self.forced is None:
                self._decide(time.monotonic())

    def _read_cpu(self) -> None:
        now, cpu = time.monotonic(), time.process_time()
        then, cpu_then = self._cpu_at
        if now - then >= CPU_EVERY_S:
            share = (cpu - cpu_then) / (now - then)
            self.pressure.cpu += SMOOTHING * 2 * (share - self.pressure.cpu)
            self._cpu_at = (now, cpu)

    def _decide(self, now: float) -> None:
        number = self.level.number
        if pressed(self.pressure):
            self.calm_since = None
            self.pressed_since = self.pressed_since or now
            top = number == len(self.table) - 1
            settled = now - self.changed_at >= SETTLE_S or number == 0
            if not top and settled and now - self.pressed_since >= UP_AFTER_S:
                self._set(self.table[number + 1])
            return
        self.pressed_since = None
        if number == 0 or not fits_below(self.pressure, self.level, self.table[number - 1]):
            self.calm_since = None
            return
        self.calm_since = self.calm_since or now
        if now - self.calm_since >= DOWN_AFTER_S:
            self._set(self.table[number - 1])

    def _set(self, level: Level) -> None:
        if level == self.level:
            return
        logger.warning(
            "live load: %s -> %s (loop lag %.0f ms, telemetry backlog %.0f ms, cpu %.0f %%)",
            self.level.name,
            level.name,
            self.pressure.lag_s * 1000,
            self.pressure.backlog_s * 1000,
            self.pressure.cpu * 100,
        )
        self.level = level
        self.changed_at = time.monotonic()
        self.pressed_since = self.calm_since = None
        for listener in list(self._listeners):
            with contextlib.suppress(Exception):
                listener.load_changed(level)


_monitors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoadMonitor] = (
    weakref.WeakKeyDictionary()
)


def monitor() -> LoadMonitor:
    """The running loop's monitor."""
    loop = asyncio.get_running_loop()
    found = _monitors.get(loop)
    if found is None:
        found = _monitors[loop] = LoadMonitor(loop)
    return found


def current_level() -> Level:
    """The running loop's level (normal when no loop runs)."""
    try:
        return monitor().level
    except RuntimeError:
        return levels()[0]
