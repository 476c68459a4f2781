"""A replica's output, on request: the server asks the agent of the replica's host for the last
lines (``logs_request``, down), the agent answers once (``logs``, up).

Only over the WebSocket: the REST transport has no way down between two polls. The answer is
bounded three ways, so that one request can never cost the socket its frame limit (1 MiB by
default on the server, :func:`fleet.agents.guard.max_message_bytes`):

* at most :data:`MAX_LOG_LINES` lines (the newest);
* each line cut to :data:`MAX_LOG_LINE_CHARS` characters;
* the lines' JSON text within :data:`MAX_LOG_BYTES` in all (5,000 lines of 4 KiB would be 20 MiB):
  the oldest lines go first.

Whatever was cut or left out sets ``truncated``, as does any older output that was not asked for.

**Stamps and older lines** (optional fields, added without a new protocol version: a peer that
does not know them drops them, :mod:`hostagent.protocol`). An agent that keeps a replica's output
in its ring (the process runtime, :class:`hostagent.runtime.output.OutputRing`) answers with
``stamps`` (when it captured each line, Unix seconds; ``None`` for a line it found already
written) and ``seqs`` (each line's number in the ring: the cursor a request's ``before`` takes),
and ``gone`` when older output existed but has left the ring. A request's ``before`` asks for the
lines older than that cursor, its ``q`` for the lines containing that text (any case). An agent
that predates these fields ignores ``before`` and ``q`` and answers without ``seqs``: the server
sees that and says so instead of passing the newest lines off as older ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Literal, NotRequired, TypedDict

from msgspec import Meta

from hostagent.protocol.bounds import Text

MAX_LOG_LINES = 5000
"""Lines one request may ask for and one answer may carry."""
DEFAULT_LOG_LINES = 200
"""Lines asked for when the operator says nothing."""
MAX_LOG_LINE_CHARS = 4096
"""Characters of one line; a longer one is cut (and the answer says ``truncated``)."""
MAX_LOG_BYTES = 512 * 1024
"""The lines of one answer, as JSON text (escapes and separators included); the rest of the
message is a few hundred bytes, so an answer stays well within the server's 1 MiB frames."""
MAX_LOG_QUERY = 200
"""Characters of a search (``q``)."""
MAX_LOG_SEQ = 2**53
"""A line's number in an agent's ring stays below this (JSON numbers are exact up to here)."""
MAX_REQUEST_ID = 64
"""Characters of a request id (the server's, echoed by the agent)."""

RequestId = Annotated[str, Meta(min_length=1, max_length=MAX_REQUEST_ID)]
AllocationId = Annotated[int, Meta(ge=1, le=2**63 - 1)]
LogLine = Annotated[str, Meta(max_length=MAX_LOG_LINE_CHARS)]
LogSeq = Annotated[int, Meta(ge=1, le=MAX_LOG_SEQ)]
LogStamp = Annotated[float, Meta(ge=0, le=2**40)]


class LogsRequest(TypedDict):
    """Down: send the last ``tail`` lines of the replica ``allocation_id``'s output."""

    type: Literal["logs_request"]
    request_id: RequestId
    allocation_id: AllocationId
    tail: Annotated[int, Meta(ge=1, le=MAX_LOG_LINES)]
    before: NotRequired[LogSeq]
    """Only lines older than this cursor (a ``seqs`` value of an earlier answer)."""
    q: NotRequired[Annotated[str, Meta(min_length=1, max_length=MAX_LOG_QUERY)]]
    """Only lines containing this text, compared without case."""


class Logs(TypedDict):
    """Up: the answer to one ``logs_request`` (same ``request_id`` and ``allocation_id``).

    ``lines`` are the newest lines, oldest first, without their line ends. ``truncated``: more
    output exists than was sent, or lines were cut. ``error`` says why there are no lines (no such
    replica on this host, no output yet, the runtime could not read it), else ``None``.
    """

    type: Literal["logs"]
    request_id: RequestId
    allocation_id: AllocationId
    lines: Annotated[list[LogLine], Meta(max_length=MAX_LOG_LINES)]
    truncated: bool
    error: Text | None
    stamps: NotRequired[Annotated[list[LogStamp | None], Meta(max_length=MAX_LOG_LINES)]]
    """When the agent captured each line (as many as ``lines``); ``None``: not known."""
    seqs: NotRequired[Annotated[list[LogSeq], Meta(max_length=MAX_LOG_LINES)]]
    """Each line's cursor, increasing (as many as ``lines``): absent when the output cannot be
    paged (a container's, kept by Docker; an agent that predates paging)."""
    gone: NotRequired[bool]
    """Older output existed but the agent no longer keeps it: no ``before`` can reach it."""


def bound_log_lines(
    lines: Sequence[str], tail: int = MAX_LOG_LINES, *, truncated: bool = False
) -> tuple[list[str], bool]:
    """The newest ``tail`` of ``lines`` within the bounds of a :class:`Logs` answer, and whether
    anything was left out or cut (or already was: ``truncated``).

    Lines are cut to :data:`MAX_LOG_LINE_CHARS`; then, newest first, kept while their JSON text
    fits in :data:`MAX_LOG_BYTES` (``json.dumps``' ASCII escapes, as :func:`encode` writes them).
    """
    tail = max(0, min(tail, MAX_LOG_LINES))
    newest = list(lines[-tail:]) if tail else []
    truncated = truncated or len(newest) < len(lines)
    kept: list[str] = []
    budget = MAX_LOG_BYTES
    for line in reversed(newest):
        if len(line) > MAX_LOG_LINE_CHARS:
            line, truncated = line[: MAX_LOG_LINE_CHARS - 1] + "…", True
        cost = len(json.dumps(line)) + 1  # the separator
        if cost > budget:
            truncated = True
            break
        budget -= cost
        kept.append(line)
    kept.reverse()
    return kept, truncated


def log_bytes(lines: Sequence[str]) -> int:
    """What :func:`bound_log_lines` counts: the lines' JSON text and separators."""
    return sum(len(json.dumps(line)) + 1 for line in lines)
