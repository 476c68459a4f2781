"""The balancer's update lag, as ``bench_endpoints`` measures it: how long after Fleet knows a
copy's new state (its database says so) HAProxy's server has that state.

``python -m fleet.bench.gateway_watch SOCKET OUT.jsonl`` runs with the stack's environment (its
database) until SIGTERM. Every ``POLL_S`` it reads what the gateways should hold
(:func:`fleet.endpoints.selectors.gateway_routes`, the gateway's own read) and what HAProxy holds
(``show servers state`` on its Runtime API), and writes a line per change of either:
``{"t": unix time, "side": "fleet"|"haproxy", "server": "ep_0/r12", "state": ...}`` with state
``ready`` (in the rotation), ``drain`` (no new request) or ``absent``.

:func:`update_lags` pairs each Fleet change with the first HAProxy reading that matches it: a copy
Fleet drains or drops is matched by HAProxy's ``drain``/``maint`` or by its deletion (a server
holding connections is deleted only once they end, by design); a ready copy by a server in the
rotation. The polls add up to ``POLL_S`` of error either way.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

POLL_S = 0.05
OUT_OF_ROTATION = {"drain", "absent"}


def fleet_states(before: dict[str, str]) -> dict[str, str]:
    """What the gateways should hold; a copy Fleet *holds* (its agent re-checks it) keeps the
    state it had."""
    from django.db import close_old_connections

    from fleet.endpoints.haproxy.config import backend_name
    from fleet.endpoints.selectors import gateway_routes

    close_old_connections()
    states = {}
    for route in gateway_routes():
        for server in route.servers:
            key = f"{backend_name(route.slot)}/{server.name}"
            if server.hold:
                if key in before:
                    states[key] = before[key]
            else:
                states[key] = "drain" if server.draining else "ready"
    return states


def haproxy_states(socket: str) -> dict[str, str]:
    from fleet.endpoints.haproxy.config import ACTIVATOR, slot_of
    from fleet.endpoints.haproxy.runtime import RuntimeApi, servers_state

    return {
        f"{row.backend}/{row.name}": "drain" if row.drain or row.maint else "ready"
        for row in servers_state(RuntimeApi(socket))
        if slot_of(row.backend) is not None and row.name != ACTIVATOR  # the backup, not a copy
    }


def watch(socket: str, out: Path, stop: threading.Event) -> None:
    from fleet.endpoints.haproxy.runtime import RuntimeApiError

    held: dict[str, dict[str, str]] = {"fleet": {}, "haproxy": {}}
    with out.open("a", encoding="utf-8") as sink:
        while not stop.is_set():
            for side in ("fleet", "haproxy"):
                try:
                    now = fleet_states(held[side]) if side == "fleet" else haproxy_states(socket)
                except (RuntimeApiError, OSError):
                    continue
                stamp = time.time()
                before = held[side]
                for server in sorted(set(before) | set(now)):
                    state = now.get(server, "absent")
                    if before.get(server, "absent") != state:
                        line = {"t": stamp, "side": side, "server": server, "state": state}
                        sink.write(json.dumps(line) + "\n")
                held[side] = now
            sink.flush()
            stop.wait(POLL_S)


def _matches(fleet_state: str, haproxy_state: str) -> bool:
    if fleet_state == "ready":
        return haproxy_state == "ready"
    return haproxy_state in OUT_OF_ROTATION


def update_lags(events: Iterable[dict[str, Any]]) -> tuple[list[float], int]:
    """The lag (ms) of each Fleet change that needed HAProxy to change, and how many HAProxy
    never followed (the copy changed again first, or the run ended).

    A Fleet change HAProxy already matches counts 0 ms when the state before it did not (the
    gateway read it between two of the watcher's polls), and not at all when it did (``drain``
    to ``absent``: the balancer has nothing to do)."""
    by_server: dict[str, list[dict[str, Any]]] = {}
    for event in sorted(events, key=lambda e: float(e["t"])):
        by_server.setdefault(str(event["server"]), []).append(event)
    lags: list[float] = []
    missed = 0
    for timeline in by_server.values():
        haproxy, fleet = "absent", "absent"
        pending: dict[str, Any] | None = None
        for event in timeline:
            if event["side"] == "haproxy":
                haproxy = event["state"]
                if pending is not None and _matches(pending["state"], haproxy):
                    lags.append(max(0.0, (float(event["t"]) - float(pending["t"])) * 1000.0))
                    pending = None
                continue
            if pending is not None:
                missed += 1
                pending = None
            if not _matches(event["state"], haproxy):
                pending = event
            elif not _matches(fleet, haproxy):
                lags.append(0.0)
            fleet = event["state"]
        if pending is not None:
            missed += 1
    return lags, missed


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: Sequence[str]) -> int:
    import django

    django.setup()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    watch(argv[1], Path(argv[2]), stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
