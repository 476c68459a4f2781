"""Admitting agent sockets cheaply, so that a whole fleet reconnecting at once is let in.

A server restart, an upgrade or a load balancer failover makes every agent reconnect within a few
seconds. Each handshake used to wait for a token query in the shared thread pool, behind the
hellos of the agents already in; past capacity the handshakes outlived daphne's timeouts, were
refused (HTTP 403), and the agents' retries came back in waves. Now accepting a socket costs
O(1) small work on the event loop:

* **Tokens** are checked from a short-lived per-process cache (``FLEET_AGENT_AUTH_CACHE_SECONDS``,
  10 s; a revocation reaching a socket of the host drops its entries, and a socket admitted from
  the cache is checked against the database again right after). A token the cache does not know
  waits for the next batched lookup: one query for every handshake that arrived meanwhile, on a
  thread of its own (:data:`CONTROL`), never behind hellos. An entry keeps the token's expiry,
  so a token that expires while cached is refused all the same.
* **Hellos**, the expensive part of a new connection (what the agent discovered, written in a
  transaction), run a few at a time (:data:`HELLOS_AT_ONCE`) while the socket already carries
  heartbeats and telemetry.
* **Past capacity** (too many hellos waiting, or the event loop too late to answer handshakes in
  time), a new socket is accepted, told when to come back (``retry_later``, from the measured
  hello rate) and closed with :data:`~hostagent.protocol.CLOSE_RETRY_LATER`. Never held until a
  timeout.

Threads: :data:`CONTROL` (token lookups, heartbeats, desired state, acks, events) and
:data:`TELEMETRY` (telemetry batches) are pools of their own, so a storm of hellos in the default
pool never delays a heartbeat or a push.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from channels.db import database_sync_to_async
from django.conf import settings

from fleet.agents.enrollment import TokenHolder, holder_admitted, hosts_authenticate
from fleet.live.load import monitor

T = TypeVar("T")

CONTROL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fleet-control")
"""Token lookups, heartbeats, desired state, acks and events: never behind hellos or batches."""
TELEMETRY = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-telemetry")
"""Telemetry batches, one at a time (they never overlap anyway)."""

HELLOS_AT_ONCE = 4
"""Hellos handled at once per process; the others wait their turn on an open socket."""
HELLO_BACKLOG_MAX = 500
"""Sockets waiting for their hello's turn past which a new socket is told to come back later."""
LAG_REFUSE_S = 2.0
"""Loop lag past which a handshake is answered "later": daphne drops a handshake after 5 s."""
RETRY_MIN_S, RETRY_MAX_S = 2.0, 60.0
LOOKUP_GATHER_S = 0.01
"""How long a token lookup waits for other handshakes to join its query."""


def in_thread(executor: ThreadPoolExecutor, call: Callable[..., T]) -> Callable[..., Any]:
    """``call`` run in ``executor``'s threads with Django's connection handling (awaitable)."""
    return database_sync_to_async(call, thread_sensitive=False, executor=executor)  # type: ignore[no-any-return]


def cache_seconds() -> float:
    return float(getattr(settings, "FLEET_AGENT_AUTH_CACHE_SECONDS", 10.0))


def wall_clock() -> float:
    """Now in Unix seconds, what token expiries are compared with (tests move it)."""
    return time.time()


class Admission:
    """The agent sockets' door on one event loop: tokens, the hello queue, "come back later"."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # token -> (holder or None, when it was read from the database)
        self.cache: dict[str, tuple[TokenHolder | None, float]] = {}
        self.waiting: dict[str, list[asyncio.Future[TokenHolder | None]]] = {}
        self.lookup: asyncio.Task[None] | None = None
        self.hellos = asyncio.Semaphore(HELLOS_AT_ONCE)
        self.hellos_waiting = 0
        self.hello_rate = 20.0  # hellos a second, smoothed
        self.refused = 0
        self.lookups = 0

    # -- tokens --------------------------------------------------------------------------

    async def authenticate(
        self, token: str, *, fresh: bool = False
    ) -> tuple[TokenHolder | None, float]:
        """The token's holder (``None``: not a host token, or an expired one) and when that
        was read. ``fresh``: skip the cache (a socket admitted from it is checked again this
        way)."""
        cached = self.cache.get(token)
        now = time.monotonic()
        if not fresh and cached is not None and now - cached[1] < cache_seconds():
            return holder_admitted(cached[0], wall_clock()), cached[1]
        future: asyncio.Future[TokenHolder | None] = self.loop.create_future()
        self.waiting.setdefault(token, []).append(future)
        if self.lookup is None or self.lookup.done():
            self.lookup = self.loop.create_task(self._lookups())
        holder = await future
        return holder_admitted(holder, wall_clock()), self.cache.get(token, (holder, now))[1]

    def forget_host(self, host_id: int) -> None:
        """The host's token was revoked or rotated: what this process remembers of it goes."""
        for token in [t for t, (h, _) in self.cache.items() if h and h.host_id == host_id]:
            del self.cache[token]

    async def _lookups(self) -> None:
        while self.waiting:
            await asyncio.sleep(LOOKUP_GATHER_S)
            batch, self.waiting = self.waiting, {}
            try:
                found = await in_thread(CONTROL, hosts_authenticate)(list(batch))
            except Exception as error:  # the database is down: these handshakes fail alone
                for futures in batch.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(error)
                continue
            self.lookups += 1
            read_at = time.monotonic()
            if len(self.cache) > 50_000:
                self.cache.clear()
            for token, futures in batch.items():
                holder = found.get(token)
                self.cache[token] = (holder, read_at)
                for future in futures:
                    if not future.done():
                        future.set_result(holder)

    # -- the door ------------------------------------------------------------------------

    def come_back_in(self) -> float | None:
        """Seconds a new socket should wait before trying again, or ``None`` to admit it."""
        lag = monitor().pressure.lag_s
        if self.hellos_waiting < HELLO_BACKLOG_MAX and lag < LAG_REFUSE_S:
            return None
        self.refused += 1
        wait = self.hellos_waiting / max(self.hello_rate, 1.0) + lag
        return min(RETRY_MAX_S, max(RETRY_MIN_S, wait))

    @contextlib.asynccontextmanager
    async def hello_turn(self) -> AsyncIterator[None]:
        """Wait for a turn to handle a hello (at most :data:`HELLOS_AT_ONCE` at once)."""
        self.hellos_waiting += 1
        try:
            await self.hellos.acquire()
        finally:
            self.hellos_waiting -= 1
        started = time.monotonic()
        try:
            yield
        finally:
            self.hellos.release()
            took = max(time.monotonic() - started, 1e-3)
            self.hello_rate += 0.2 * (HELLOS_AT_ONCE / took - self.hello_rate)


_admissions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Admission] = (
    weakref.WeakKeyDictionary()
)


def admission() -> Admission:
    """The running loop's admission."""
    loop = asyncio.get_running_loop()
    found = _admissions.get(loop)
    if found is None:
        found = _admissions[loop] = Admission(loop)
    return found
