"""Bring a running HAProxy to the fleet's endpoints: what :func:`plan` computes from what HAProxy
holds now (pure), and :func:`sync` applies over the Runtime API.

Order matters for the caller's requests: new servers are added and enabled before a route points
at their backend; a server leaves the rotation (``drain``) while its copy still runs, goes to
maintenance once it serves nothing (which closes HAProxy's idle connections to it: its agent
then ends the copy's drain early), and is deleted only once it holds no connection; a route goes
before its backend's last server.
Every run starts from HAProxy's own state, so a sync that failed half-way, a restarted HAProxy
or a restarted gateway is repaired by the next run.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from fleet.endpoints.haproxy.config import ACTIVATOR, GatewayConfig, backend_name, slot_of
from fleet.endpoints.haproxy.runtime import (
    RuntimeApi,
    RuntimeApiError,
    ServerState,
    map_entries,
    server_sessions,
    servers_state,
)

logger = logging.getLogger(__name__)

_IPV6 = re.compile(r"^[0-9A-Fa-f:.]+$")
_OK = ("", "New server registered.", "Server deleted.")


def path_key(path_prefix: str) -> str:
    """The paths map's key: the prefix's one segment, without its ``/``."""
    return path_prefix.strip("/")


@dataclass(frozen=True)
class Server:
    """One copy of a deployment: ``name`` is ``r<allocation id>``; ``draining``: it takes no new
    request (its copy is about to stop), those in flight finish; ``hold``: Fleet is re-checking
    a copy that was running (its agent restarted): the balancer keeps it as it is, in the
    rotation or out of it, until Fleet knows again."""

    name: str
    address: str
    port: int
    draining: bool = False
    hold: bool = False

    @property
    def target(self) -> str:
        host = f"[{self.address}]" if ":" in self.address and _IPV6.match(self.address) else None
        return f"{host or self.address}:{self.port}"


@dataclass(frozen=True)
class Route:
    """One endpoint: its backend slot, what a request carries to reach it, and its copies."""

    slot: int
    hostname: str | None
    path_prefix: str | None
    servers: tuple[Server, ...] = ()


@dataclass
class SyncResult:
    commands: list[tuple[str, ...]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    waiting: int = 0  # servers left out of the rotation that still hold connections
    deferred: int = 0  # drains waiting for a copy that stays to pass its first check

    @property
    def settled(self) -> bool:
        return not (self.errors or self.waiting or self.deferred)


def plan(
    config: GatewayConfig,
    routes: Sequence[Route],
    held: Iterable[ServerState],
    hosts: dict[str, str],
    paths: dict[str, str],
    sessions: dict[tuple[str, str], int],
) -> tuple[list[tuple[str, ...]], int, int]:
    """The Runtime API commands that take HAProxy from what it holds to ``routes``, in order;
    how many servers wait for their connections to end before they can be deleted; and how
    many drains wait for a copy that stays to be up (run again soon when either is not 0)."""
    first: list[tuple[str, ...]] = []  # servers added or changed
    maps: list[tuple[str, ...]] = []
    last: list[tuple[str, ...]] = []  # servers leaving
    by_backend: dict[str, dict[str, ServerState]] = {}
    for row in held:
        if slot_of(row.backend) is not None and row.name != ACTIVATOR:
            by_backend.setdefault(row.backend, {})[row.name] = row
    wanted_hosts: dict[str, str] = {}
    wanted_paths: dict[str, str] = {}
    waiting = deferred = 0
    for route in routes:
        backend = backend_name(route.slot)
        now: dict[str, ServerState] = by_backend.pop(backend, {})
        serving = {n for n, st in now.items() if st.up and not (st.drain or st.maint)}
        staying = {sv.name for sv in route.servers if not sv.draining}
        # Make before break, in the balancer too: a copy leaves the rotation once another copy
        # that stays is in it and up (a server just added is up after its first check), or
        # when no copy stays at all.
        may_drain = bool(serving & staying) or not staying
        for server in route.servers:
            key = f"{backend}/{server.name}"
            state = now.pop(server.name, None)
            if server.hold:
                continue
            if state is None:
                first += [
                    ("add", "server", key, server.target, "check"),
                    ("enable", "health", key),
                    ("set", "server", key, "state", "drain" if server.draining else "ready"),
                ]
                continue
            out = state.drain or state.maint
            if server.draining and not out and not may_drain:
                deferred += 1
                continue
            if (state.address, state.port) != (server.address.strip("[]"), server.port):
                first.append(
                    ("set", "server", key, "addr", server.address, "port", str(server.port))
                )
            if server.draining and not out:
                first.append(("set", "server", key, "state", "drain"))
            elif server.draining and state.drain and sessions.get((backend, server.name), 0) == 0:
                # Out of the rotation and serving nothing: maintenance closes the balancer's
                # idle connections to it, so its agent sees it drained and stops it now
                # rather than at the end of its drain_s (hostagent.runtime.operations).
                first.append(("set", "server", key, "state", "maint"))
            elif not server.draining and out:
                first.append(("set", "server", key, "state", "ready"))
        for state in now.values():  # copies this endpoint no longer has
            left, wait = _retire(backend, state, sessions)
            last += left
            waiting += wait
        if route.hostname:
            wanted_hosts[route.hostname] = backend
        if route.path_prefix:
            wanted_paths[path_key(route.path_prefix)] = backend
    for backend, states in by_backend.items():  # endpoints gone
        for state in states.values():
            left, wait = _retire(backend, state, sessions)
            last += left
            waiting += wait
    for path, wanted, held_map in (
        (config.hosts_map, wanted_hosts, hosts),
        (config.paths_map, wanted_paths, paths),
    ):
        for key, backend in wanted.items():
            if key not in held_map:
                maps.append(("add", "map", str(path), key, backend))
            elif held_map[key] != backend:
                maps.append(("set", "map", str(path), key, backend))
        maps += [("del", "map", str(path), key) for key in held_map if key not in wanted]
    return first + maps + last, waiting, deferred


def _retire(
    backend: str, state: ServerState, sessions: dict[tuple[str, str], int]
) -> tuple[list[tuple[str, ...]], int]:
    key = f"{backend}/{state.name}"
    if sessions.get((backend, state.name), 0) > 0:
        # Still answering: out of the rotation, deleted by a later run once its last ends.
        return ([] if state.drain or state.maint else [("set", "server", key, "state", "drain")], 1)
    commands: list[tuple[str, ...]] = []
    if not state.maint:
        commands.append(("set", "server", key, "state", "maint"))
    commands.append(("del", "server", key))
    return commands, 0


def sync(api: RuntimeApi, config: GatewayConfig, routes: Sequence[Route]) -> SyncResult:
    """Read what HAProxy holds, apply :func:`plan`; errors are collected, not raised (the next
    run retries), except when HAProxy cannot be reached at all."""
    commands, waiting, deferred = plan(
        config,
        routes,
        servers_state(api),
        map_entries(api, config.hosts_map),
        map_entries(api, config.paths_map),
        server_sessions(api),
    )
    result = SyncResult(waiting=waiting, deferred=deferred)
    for command in commands:
        try:
            answer = api.command(*command).strip()
        except RuntimeApiError as exc:
            result.errors.append(str(exc))
            continue
        result.commands.append(command)
        if answer not in _OK:
            result.errors.append(f"{' '.join(command)}: {answer[:200]}")
    _persist_maps(config, routes)
    if result.errors:
        logger.warning("gateway sync: %d error(s), first: %s", len(result.errors), result.errors[0])
    return result


def _persist_maps(config: GatewayConfig, routes: Sequence[Route]) -> None:
    """The maps on disk too: an HAProxy that restarts routes as before while the gateway has
    still to re-add the servers."""
    for path, keys in (
        (config.hosts_map, [(r.hostname, r.slot) for r in routes if r.hostname]),
        (config.paths_map, [(path_key(r.path_prefix), r.slot) for r in routes if r.path_prefix]),
    ):
        text = "".join(f"{key} {backend_name(slot)}\n" for key, slot in sorted(keys))
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
