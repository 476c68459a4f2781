"""A replica's output, read on request (``logs_request``): the newest lines of a process
workload's log files, read from their end (:func:`tail_lines`), or a container's through the
Engine API (:meth:`hostagent.runtime.docker.DockerRuntime.logs`).

Reading never loads a whole log: at most :data:`READ_MAX_BYTES` from the end, which is more than
one answer may carry anyway (:data:`hostagent.protocol.MAX_LOG_BYTES`). Lines are decoded as
UTF-8 with replacement characters: a workload's bytes are not the agent's to refuse. A team
secret's value in them is masked (:func:`mask_secrets`) before the lines leave the agent.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hostagent.protocol import MAX_LOG_BYTES

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
    return Output(lines, output.truncated)


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
