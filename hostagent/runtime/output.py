"""A replica's output, read on request (``logs_request``): the newest lines of a process
workload's log files, read from their end (:func:`tail_lines`), or a container's through the
Engine API (:meth:`hostagent.runtime.docker.DockerRuntime.logs`).

**Stamps and older lines.** A process workload writes its log itself (no pipe through the agent,
:mod:`hostagent.runtime.process`), so the agent *captures* it: every supervision tick it reads what
the log grew by and appends those lines to the replica's :class:`OutputRing`, stamped with the time
it read them (within one tick, half a second by default, of when they were written). The ring is
bounded (:data:`RING_LINES` lines and :data:`RING_BYTES` bytes a replica): older lines leave it,
and an answer that reaches its oldest line says they are ``gone``. Lines the agent found already
written (at its start, or a replica it adopted) carry no stamp. Each line has a number in its
ring (``seq``): the cursor with which older lines are asked for.

Reading never loads a whole log: at most :data:`READ_MAX_BYTES` from the end, which is more than
one answer may carry anyway (:data:`hostagent.protocol.MAX_LOG_BYTES`). Lines are decoded as
UTF-8 with replacement characters: a workload's bytes are not the agent's to refuse. A team
secret's value in them is masked (:func:`mask_secrets`) before the lines leave the agent.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from hostagent.protocol import MAX_LOG_BYTES, MAX_LOG_LINE_CHARS, MAX_LOG_LINES

READ_MAX_BYTES = 2 * MAX_LOG_BYTES
"""Bytes read from the end of the log files for one request, all files together."""
MASK = "***"
MIN_MASKED_CHARS = 4
"""Shorter secret values are not masked: ``1`` or ``yes`` would mask half of every line."""


@dataclass(frozen=True)
class Output:
    """The newest lines of a replica's output, oldest first, without their line ends;
    ``truncated``: older output exists that is not among them."""

    lines: list[str]
    truncated: bool
    stamps: list[float | None] | None = None
    """When the agent captured each line (Unix seconds), ``None`` where not known; ``None`` in
    all: the runtime does not stamp (Docker's own stamps are read into it, though)."""
    seqs: list[int] | None = field(default=None)
    """Each line's number in its :class:`OutputRing` (the cursor for older lines); ``None``:
    this output cannot be paged."""
    gone: bool = False
    """Older output existed and is no longer kept."""


class NoOutput(LookupError):
    """There is nothing to read; ``str(error)`` says why, in words for the operator."""


def mask_secrets(output: Output, values: Iterable[str]) -> Output:
    """``output`` with each of ``values`` (of :data:`MIN_MASKED_CHARS` or more; each line of a
    value of several lines too) replaced by :data:`MASK`, the longest first (a value inside
    another is not left half shown)."""
    pieces = {
        piece
        for value in values
        for piece in (value, *value.splitlines())
        if len(piece) >= MIN_MASKED_CHARS
    }
    if not pieces:
        return output
    ordered = sorted(pieces, key=len, reverse=True)
    lines = []
    for line in output.lines:
        for piece in ordered:
            if piece in line:
                line = line.replace(piece, MASK)
        lines.append(line)
    return replace(output, lines=lines)


def search(output: Output, q: str, tail: int) -> Output:
    """The newest ``tail`` of ``output``'s lines that contain ``q`` (without case), with their
    stamps and cursors. Searched after :func:`mask_secrets`: a search for a secret's value finds
    nothing (it would otherwise tell whether a guess is the value)."""
    folded = q.casefold()
    found = [i for i, line in enumerate(output.lines) if folded in line.casefold()]
    more = len(found) > tail
    found = found[-tail:] if tail else []
    older = output.truncated or more or (bool(found) and found[0] > 0)
    return Output(
        [output.lines[i] for i in found],
        older,
        None if output.stamps is None else [output.stamps[i] for i in found],
        None if output.seqs is None else [output.seqs[i] for i in found],
        gone=output.gone and not more,
    )


RING_LINES = MAX_LOG_LINES * 2
"""Lines one replica's ring keeps (two full answers: older lines on demand, bounded). About
2 MiB of the agent's memory at most, Python's own per line included: an MPS GPU may hold
dozens of replicas, and a host eight such GPUs."""
RING_BYTES = 2 * MAX_LOG_BYTES
"""Characters one replica's ring keeps, all lines together (1 MiB with the default bounds)."""
PARTIAL_MAX = MAX_LOG_LINE_CHARS * 4
"""Bytes of a line without its end yet that wait for it; past this the piece is a line."""


class OutputRing:
    """The newest lines of one replica's output, each with its capture time and number
    (``seq``, from 1, never reused), within :data:`RING_LINES` and :data:`RING_BYTES`. Not
    thread-safe: its owner holds a lock."""

    def __init__(self, max_lines: int = RING_LINES, max_bytes: int = RING_BYTES) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._lines: deque[tuple[int, float | None, str]] = deque()
        self._chars = 0
        self._next_seq = 1
        self._dropped = False
        self._partial = b""
        self._partial_ts: float | None = None

    def drop_older(self) -> None:
        """Say that output older than the ring existed and is not in it."""
        self._dropped = True

    def add(self, lines: Iterable[str], stamp: float | None) -> None:
        """Append whole ``lines``, each stamped ``stamp``."""
        for line in lines:
            self._lines.append((self._next_seq, stamp, line))
            self._next_seq += 1
            self._chars += len(line) + 1
        while self._lines and (len(self._lines) > self.max_lines or self._chars > self.max_bytes):
            _, _, old = self._lines.popleft()
            self._chars -= len(old) + 1
            self._dropped = True

    def capture(self, raw: bytes, now: float | None) -> None:
        """Append the bytes the log grew by: whole lines now, stamped ``now`` (a line begun in
        an earlier capture keeps that capture's time; ``None``: not known); an unfinished last
        line waits."""
        if not raw:
            return
        if not self._partial:
            self._partial_ts = now
        data = self._partial + raw
        cut = data.rfind(b"\n")
        head, self._partial = (b"", data) if cut < 0 else (data[: cut + 1], data[cut + 1 :])
        if head:
            lines = split_lines(head)
            if lines:
                self.add(lines[:1], self._partial_ts)
                self.add(lines[1:], now)
            self._partial_ts = now if self._partial else None
        if len(self._partial) > PARTIAL_MAX:
            self.add(split_lines(self._partial), self._partial_ts)
            self._partial, self._partial_ts = b"", None

    def __len__(self) -> int:
        return len(self._lines)

    def page(self, tail: int, *, before: int | None = None) -> Output:
        """The newest ``tail`` lines older than cursor ``before`` (all when ``None``);
        ``truncated`` when older ones exist, ``gone`` when the answer reaches the oldest line
        kept and older output was dropped."""
        picked: list[tuple[int, float | None, str]] = []
        older = False
        for entry in reversed(self._lines):
            if before is not None and entry[0] >= before:
                continue
            if len(picked) >= tail:
                older = True
                break
            picked.append(entry)
        picked.reverse()
        reaches_start = not older
        return Output(
            [e[2] for e in picked],
            older or (reaches_start and self._dropped),
            [e[1] for e in picked],
            [e[0] for e in picked],
            gone=reaches_start and self._dropped,
        )


def split_lines(raw: bytes) -> list[str]:
    """``raw`` as lines: UTF-8 (bad bytes replaced), split on ``\\n``, ``\\r`` ends dropped; a
    last line without its ``\\n`` is a line too. A NUL byte is U+FFFD, as a bad byte is: the
    protocol refuses U+0000 (PostgreSQL cannot store it), and a terminal shows nothing for it."""
    lines = raw.replace(b"\0", "\ufffd".encode()).decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def tail_lines(paths: Sequence[Path], tail: int, *, max_bytes: int = READ_MAX_BYTES) -> Output:
    """The last ``tail`` lines of the log files ``paths``, newest file first (``x.log``, then
    its rotated copy ``x.log.1``): an older file is read only while the newer ones hold fewer
    than ``tail`` lines.

    Raises:
        NoOutput: none of the files exists.
    """
    newest_first: list[list[str]] = []
    count, budget, older, found = 0, max_bytes, False, False
    for path in paths:
        if count >= tail or budget <= 0:
            older = older or _size(path) > 0
            break
        try:
            raw, whole = _read_end(path, budget)
        except FileNotFoundError:
            continue
        found = True
        budget -= len(raw)
        lines = split_lines(raw)
        if not whole:  # the first line is cut, and what is before it is not read
            lines, older = lines[1:], True
        newest_first.append(lines)
        count += len(lines)
        if not whole:
            break
    if not found:
        raise NoOutput("no output yet")
    lines = [line for chunk in reversed(newest_first) for line in chunk]
    return Output(lines[-tail:] if tail else [], older or len(lines) > tail)


def _read_end(path: Path, max_bytes: int) -> tuple[bytes, bool]:
    """The last ``max_bytes`` of ``path``, and whether that is the whole file."""
    with path.open("rb") as log:
        size = os.fstat(log.fileno()).st_size
        start = max(0, size - max_bytes)
        log.seek(start)
        return log.read(max_bytes), start == 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
