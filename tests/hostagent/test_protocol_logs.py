"""The logs messages: a request's bounds, an answer's bounds (lines, line length, total bytes),
and :func:`bound_log_lines`, which keeps an agent's answer within them."""

from __future__ import annotations

import json

import pytest

from hostagent import protocol
from hostagent.protocol import (
    MAX_LOG_BYTES,
    MAX_LOG_LINE_CHARS,
    MAX_LOG_LINES,
    ProtocolError,
    bound_log_lines,
)


def _answer(lines: list[str] | None = None, **changes: object) -> dict[str, object]:
    return {
        "type": "logs",
        "request_id": "req-1",
        "allocation_id": 3,
        "lines": lines or [],
        "truncated": False,
        "error": None,
        **changes,
    }


def _request(**changes: object) -> dict[str, object]:
    return {
        "type": "logs_request",
        "request_id": "req-1",
        "allocation_id": 3,
        "tail": 50,
        **changes,
    }


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"tail": 0}, "$.tail"),
        ({"tail": MAX_LOG_LINES + 1}, "$.tail"),
        ({"request_id": ""}, "$.request_id"),
        ({"request_id": "r" * 65}, "$.request_id"),
        ({"allocation_id": 0}, "$.allocation_id"),
    ],
)
def test_a_logs_request_out_of_bounds_is_refused(change, where):
    with pytest.raises(ProtocolError) as refused:
        protocol.decode(json.dumps(_request(**change)))
    assert refused.value.path == where


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"lines": ["x"] * (MAX_LOG_LINES + 1)}, "$.lines"),
        ({"lines": ["x" * (MAX_LOG_LINE_CHARS + 1)]}, "$.lines[0]"),
        ({"lines": ["x" * 4000] * 200}, "$.lines"),  # 800 kB: over the byte budget
        ({"lines": [1]}, "$.lines[0]"),
        ({"truncated": "no"}, "$.truncated"),
        ({"error": "e" * 300}, "$.error"),
        ({"request_id": "r" * 65}, "$.request_id"),
    ],
)
def test_a_logs_answer_out_of_bounds_is_refused(change, where):
    with pytest.raises(ProtocolError) as refused:
        protocol.decode(json.dumps(_answer(**change)))
    assert refused.value.path == where


def test_unknown_keys_of_an_answer_are_dropped():
    decoded = protocol.decode(json.dumps(_answer(["a"], secret="x")))
    assert decoded == _answer(["a"])


def test_short_output_is_kept_whole_and_not_truncated():
    assert bound_log_lines(["a", "b", "c"], 200) == (["a", "b", "c"], False)


def test_only_the_newest_lines_asked_for_are_kept_and_the_rest_says_truncated():
    assert bound_log_lines([str(n) for n in range(10)], 3) == (["7", "8", "9"], True)


def test_a_long_line_is_cut_and_counts_as_truncated():
    lines, truncated = bound_log_lines(["x" * 10_000, "short"], 10)
    assert len(lines[0]) == MAX_LOG_LINE_CHARS and lines[0].endswith("…")
    assert lines[1] == "short" and truncated


def test_the_oldest_lines_go_when_the_answer_would_pass_its_byte_budget():
    # 5,000 lines of 4 KiB are 20 MiB: far over the 1 MiB frame. The newest are kept.
    many = [f"{n:05d}" + "é" * 4000 for n in range(MAX_LOG_LINES)]
    lines, truncated = bound_log_lines(many, MAX_LOG_LINES)
    assert truncated and lines and lines[-1] == many[-1][:MAX_LOG_LINE_CHARS]
    assert protocol.log_bytes(lines) <= MAX_LOG_BYTES
    answer = protocol.encode(_answer(lines, truncated=True))  # type: ignore[arg-type]
    assert len(answer.encode()) < 1024 * 1024
    assert protocol.decode(answer)["lines"] == lines  # type: ignore[typeddict-item]


def test_a_truncated_input_stays_truncated():
    assert bound_log_lines(["a"], 5, truncated=True) == (["a"], True)
