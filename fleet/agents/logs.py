"""A replica's output on request: the API asks the agent of the replica's host over its socket
(``logs_request``) and waits a few seconds for its ``logs`` answer.

**Where the answer meets the request: the Django cache.** The request is sent through the
host's agent group (the channel layer: it reaches the host's socket on whichever ASGI server
holds it); the socket's consumer stores the answer under the request id; the API view, in a
worker thread of whichever server took the HTTP request, polls for it. The cache is Redis in
production, shared by every server, and process memory (``LocMemCache``) in the embedded mode,
which is a single process: the consumer (on the event loop) and the view (in a thread) see the
same entries there too, so one mechanism serves both modes. The channel layer could carry the
answer back itself, but the in-memory layer's queues belong to the server's event loop, and a
view thread waiting on them would need the same hand-over :func:`fleet.core.events.publish`
already needs for sends; the cache needs nothing of the kind.

**Only what was asked, by whom it was asked.** Each request id is recorded with the host and
allocation it was sent for; an answer is kept only when it comes from that host's socket for that
allocation (an agent cannot fill in another host's answer, nor one never asked for).

**Stamps, older lines, search.** An agent that keeps its replicas' output in a ring (see
:mod:`hostagent.runtime.output`) answers with each line's capture time and cursor, and serves
``before`` (older lines) and ``q`` (search, over its ring). An agent that predates them answers
without either: its lines have no time, a search is made here over the lines it sent, and a
request for older lines is refused (409 ``logs.no_older``) rather than answered with the newest.
A container's output is kept by Docker, not in a ring: it has times but no cursors, alike.

**Reachable means a socket.** Each agent socket keeps a marker in the cache (refreshed by its
messages, gone when it closes or stops talking): a host without one (offline, or on the REST
transport, which has no way down between polls) is answered at once with a 409, not a timeout.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from django.core.cache import cache

from fleet.allocations.models import Allocation
from fleet.allocations.workloads import host_replica_spans
from fleet.core.errors import Conflict, NotFound, ServiceError
from fleet.core.events import agent_group, publish
from fleet.inventory.models import HostStatus
from hostagent import protocol

WAIT_S = 5.0
"""How long the API waits for an agent's answer."""
POLL_S = 0.05
SOCKET_TTL_S = 30
"""A socket's marker lives this long without a message from the agent (telemetry is 1 Hz)."""
SOCKET_REFRESH_S = 10.0
"""A socket refreshes its marker at most this often."""
REQUEST_TTL_S = 30


@dataclass(frozen=True)
class ReplicaLogs:
    """The newest lines of a replica's output (see :class:`hostagent.protocol.Logs`)."""

    lines: list[str]
    truncated: bool
    error: str | None
    stamps: list[float | None]
    """When the agent captured each line (Unix seconds); ``None``: not known."""
    seqs: list[int] | None
    """Each line's cursor (for ``before``); ``None``: this output cannot be paged."""
    gone: bool
    """Older output existed and the agent no longer keeps it."""


def _socket_key(host_id: int) -> str:
    return f"agents:socket:{host_id}"


def _request_key(request_id: str) -> str:
    return f"agents:logs-request:{request_id}"


def _answer_key(request_id: str) -> str:
    return f"agents:logs-answer:{request_id}"


def agent_socket_open(host_id: int, channel_name: str) -> None:
    """The host's socket is (still) open on ``channel_name``."""
    cache.set(_socket_key(host_id), channel_name, SOCKET_TTL_S)


def agent_sockets_open(channels: dict[int, str]) -> None:
    """Many hosts' sockets are (still) open: one cache round trip (``{host id: channel}``)."""
    if channels:
        cache.set_many({_socket_key(h): c for h, c in channels.items()}, SOCKET_TTL_S)


def agent_socket_closed(host_id: int, channel_name: str) -> None:
    """The socket on ``channel_name`` closed (a newer socket's marker is left alone)."""
    if cache.get(_socket_key(host_id)) == channel_name:
        cache.delete(_socket_key(host_id))


def agent_socket_connected(host_id: int) -> bool:
    """Whether the host's agent has an open socket (on any server)."""
    return cache.get(_socket_key(host_id)) is not None


def logs_answer_store(host_id: int, answer: protocol.Logs) -> bool:
    """Keep an agent's answer for the view waiting on it, if that request was sent to this host
    for this allocation; else drop it (False)."""
    request_id = answer["request_id"]
    if cache.get(_request_key(request_id)) != [host_id, answer["allocation_id"]]:
        return False
    cache.set(_answer_key(request_id), dict(answer), REQUEST_TTL_S)
    return True


def allocation_logs(
    *,
    allocation_id: int,
    tail: int,
    before: int | None = None,
    q: str | None = None,
    timeout_s: float | None = None,
) -> ReplicaLogs:
    """Ask the agent of the allocation's host for its replica's last ``tail`` lines (older than
    cursor ``before``, containing ``q`` without case, where given) and wait (at most
    ``timeout_s``, :data:`WAIT_S` by default) for the answer. Blocks: call from a worker thread.

    Raises:
        NotFound: no such allocation (``not_found``).
        Conflict: the host's agent has no open socket (``logs.agent_unreachable``); ``before``
            was asked of output that has no cursors (``logs.no_older``).
        ServiceError: no answer within ``timeout_s`` (``logs.timeout``, 504).
    """
    allocation = Allocation.objects.select_related("gpu__host").filter(pk=allocation_id).first()
    if allocation is None:
        raise NotFound("not_found", f"No allocation with id {allocation_id}.")
    host = allocation.gpu.host
    timeout_s = WAIT_S if timeout_s is None else timeout_s
    if not agent_socket_connected(host.pk):
        raise _unreachable(host.name, host.status)
    # A replica of several whole GPUs runs from its first GPU's allocation: its output is there.
    allocation_id = next(
        (lead for lead, pks in host_replica_spans(host.pk).items() if allocation_id in pks),
        allocation_id,
    )
    request_id = secrets.token_urlsafe(24)
    cache.set(_request_key(request_id), [host.pk, allocation_id], REQUEST_TTL_S)
    request: protocol.LogsRequest = {
        "type": "logs_request",
        "request_id": request_id,
        "allocation_id": allocation_id,
        "tail": tail,
    }
    if before is not None:
        request["before"] = before
    if q:
        request["q"] = q
    try:
        if not publish(agent_group(host.pk), "agent.logs_request", {"message": request}):
            raise _unreachable(host.name, host.status)
        answer = _wait(request_id, timeout_s)
    finally:
        cache.delete_many([_request_key(request_id), _answer_key(request_id)])
    if answer is None:
        raise ServiceError(
            "logs.timeout",
            f"The agent of host {host.name} did not answer within {timeout_s:g} s.",
            {"host": host.pk, "timeout_s": timeout_s},
            status_code=504,
        )
    return _projected(answer, before=before, q=q)


def _projected(answer: protocol.Logs, *, before: int | None, q: str | None) -> ReplicaLogs:
    """The agent's answer as the API serves it; an agent that predates stamps and cursors is
    searched here, and refused older lines (it would have sent the newest)."""
    lines, error = list(answer["lines"]), answer["error"]
    stamps = answer.get("stamps")
    seqs = answer.get("seqs")
    if before is not None and seqs is None and error is None:
        raise Conflict(
            "logs.no_older",
            "This replica's output cannot be paged: the agent keeps older lines for process "
            "workloads only, and an agent of an older release not at all. Ask for more of "
            f"the newest lines with tail (up to {protocol.MAX_LOG_LINES}) instead.",
            {"before": before},
        )
    truncated = bool(answer["truncated"])
    if stamps is None:  # an agent that predates stamps: it did not search either
        stamps = [None] * len(lines)
        if q:
            folded = q.casefold()
            kept = [line for line in lines if folded in line.casefold()]
            truncated = truncated or len(kept) < len(lines)
            lines, stamps = kept, [None] * len(kept)
    return ReplicaLogs(
        lines,
        truncated,
        error,
        list(stamps),
        None if seqs is None else list(seqs),
        bool(answer.get("gone", False)),
    )


def _wait(request_id: str, timeout_s: float) -> protocol.Logs | None:
    deadline = time.monotonic() + timeout_s
    while True:
        answer: protocol.Logs | None = cache.get(_answer_key(request_id))
        if answer is not None or time.monotonic() >= deadline:
            return answer
        time.sleep(POLL_S)


def _unreachable(host_name: str, status: str) -> Conflict:
    if status == HostStatus.OFFLINE:
        why = f"The host {host_name} is offline: its agent cannot be asked for logs."
    else:
        why = (
            f"The agent of host {host_name} is not connected over a WebSocket (it uses the REST "
            "transport, or is reconnecting): logs are fetched over the socket only."
        )
    return Conflict("logs.agent_unreachable", why, {"host_status": status})
