"""Reading the newest lines of a process workload's log files from their end."""

from __future__ import annotations

import pytest

from hostagent.runtime.output import NoOutput, split_lines, tail_lines


def _write(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def test_the_last_lines_of_a_log_are_read_and_the_older_ones_say_truncated(tmp_path):
    log = _write(tmp_path / "5.log", [f"line {n}" for n in range(100)])
    out = tail_lines([log, tmp_path / "5.log.1"], 3)
    assert out.lines == ["line 97", "line 98", "line 99"] and out.truncated


def test_a_short_log_is_read_whole_and_not_truncated(tmp_path):
    log = _write(tmp_path / "5.log", ["a", "b"])
    out = tail_lines([log, tmp_path / "5.log.1"], 200)
    assert out.lines == ["a", "b"] and not out.truncated


def test_the_rotated_log_is_read_when_the_current_one_is_shorter_than_asked(tmp_path):
    rotated = _write(tmp_path / "5.log.1", ["old 1", "old 2", "old 3"])
    log = _write(tmp_path / "5.log", ["new 1"])
    out = tail_lines([log, rotated], 3)
    assert out.lines == ["old 2", "old 3", "new 1"] and out.truncated
    whole = tail_lines([log, rotated], 10)
    assert whole.lines == ["old 1", "old 2", "old 3", "new 1"] and not whole.truncated


def test_the_rotated_log_is_not_read_when_the_current_one_is_enough_but_says_truncated(tmp_path):
    rotated = _write(tmp_path / "5.log.1", ["old"])
    log = _write(tmp_path / "5.log", ["new 1", "new 2"])
    out = tail_lines([log, rotated], 2)
    assert out.lines == ["new 1", "new 2"] and out.truncated


def test_a_huge_log_is_read_only_from_its_end(tmp_path):
    log = tmp_path / "5.log"
    log.write_bytes(b"x" * 5000 + b"\n" + b"".join(b"%d\n" % n for n in range(1000)))
    out = tail_lines([log], 5000, max_bytes=1000)
    assert out.truncated and out.lines[-1] == "999"
    assert all(line.isdigit() for line in out.lines)  # the line cut by the window is dropped
    assert sum(len(line) + 1 for line in out.lines) <= 1000


def test_a_last_line_without_its_end_bad_bytes_and_crlf_are_kept_readable(tmp_path):
    log = tmp_path / "5.log"
    log.write_bytes(b"dos\r\nbad \xff byte\nno end")
    assert tail_lines([log], 10).lines == ["dos", "bad \ufffd byte", "no end"]
    assert split_lines(b"") == []


def test_no_log_file_at_all_is_no_output(tmp_path):
    with pytest.raises(NoOutput):
        tail_lines([tmp_path / "5.log", tmp_path / "5.log.1"], 10)


def test_an_empty_log_is_no_lines(tmp_path):
    log = tmp_path / "5.log"
    log.touch()
    out = tail_lines([log, tmp_path / "5.log.1"], 10)
    assert out.lines == [] and not out.truncated


def test_a_nul_byte_in_a_workloads_output_is_a_replacement_character():
    # The protocol refuses U+0000 (PostgreSQL cannot store it): an honest agent never sends it.
    assert split_lines(b"a\0b\nc") == ["a\ufffdb", "c"]
