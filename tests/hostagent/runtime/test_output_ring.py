"""A replica's captured output: the ring stamps each line when the agent reads it, stays within
its bounds, pages older lines by cursor and says when they are gone; the process runtime feeds
it from a real workload's log; a search runs on masked lines; the answer keeps to the protocol."""

from __future__ import annotations

import time

import pytest

from hostagent import protocol
from hostagent.runtime import ProcessRuntime
from hostagent.runtime.output import Output, OutputRing, mask_secrets, search
from hostagent.runtime.sync import logs_answer_of
from tests.hostagent.runtime.fakes import wait_for
from tests.hostagent.runtime.test_process import process_spec


def test_each_line_is_stamped_when_captured_and_a_line_begun_earlier_keeps_its_start():
    ring = OutputRing()
    ring.capture(b"one\ntw", 100.0)
    ring.capture(b"o\nthree\n", 101.5)
    out = ring.page(10)
    assert out.lines == ["one", "two", "three"]
    assert out.stamps == [100.0, 100.0, 101.5]
    assert out.seqs == [1, 2, 3] and not out.truncated and not out.gone


def test_the_ring_keeps_its_bounds_and_says_older_lines_are_gone():
    ring = OutputRing(max_lines=5, max_bytes=10_000)
    for n in range(12):
        ring.capture(f"{n}\n".encode(), float(n))
    assert len(ring) == 5
    assert ring.page(3).lines == ["9", "10", "11"]
    assert ring.page(3).truncated and not ring.page(3).gone
    rest = ring.page(10, before=10)
    assert rest.lines == ["7", "8"] and rest.gone and rest.truncated
    assert ring.page(10, before=3).lines == [] and ring.page(10, before=3).gone
    by_bytes = OutputRing(max_lines=1000, max_bytes=50)
    by_bytes.capture(b"".join(b"x" * 9 + b"\n" for _ in range(20)), 1.0)
    assert len(by_bytes) == 5  # 10 characters a line with its end


def test_a_line_without_its_end_waits_but_not_forever():
    ring = OutputRing()
    ring.capture(b"progress 10%", 1.0)
    assert ring.page(10).lines == []
    ring.capture(b"x" * (protocol.MAX_LOG_LINE_CHARS * 4), 2.0)
    assert len(ring.page(10).lines) == 1 and ring.page(10).stamps == [1.0]


def test_a_search_runs_on_masked_lines_so_a_guessed_secret_finds_nothing():
    out = Output(["token=hunter2hunter2", "ok", "Hunter"], False, [1.0, 2.0, 3.0], [1, 2, 3])
    masked = mask_secrets(out, ["hunter2hunter2"])
    assert masked.stamps == [1.0, 2.0, 3.0] and masked.seqs == [1, 2, 3]
    assert search(masked, "hunter2hunter2", 10).lines == []
    found = search(masked, "HUNTER", 10)
    assert found.lines == ["Hunter"] and found.seqs == [3] and found.truncated


def test_the_answer_carries_stamps_and_cursors_and_passes_the_protocols_checks():
    ring = OutputRing()
    ring.capture(b"".join(f"line {n}\n".encode() for n in range(10)), 1_780_000_000.0)
    request: protocol.LogsRequest = {
        "type": "logs_request",
        "request_id": "r1",
        "allocation_id": 5,
        "tail": 3,
        "before": 9,
    }
    answer = logs_answer_of(request, ring.page(3, before=9))
    checked = protocol.validate_message(answer)
    assert checked["lines"] == ["line 5", "line 6", "line 7"]
    assert checked["seqs"] == [6, 7, 8] and checked["stamps"] == [1_780_000_000.0] * 3
    assert checked["truncated"] and not checked["gone"]
    # The request's new fields survive the codec; an old server's request has neither.
    assert protocol.validate_message(request)["before"] == 9
    old = protocol.validate_message({k: v for k, v in request.items() if k != "before"})
    assert "before" not in old


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"stamps": [1.0]}, "$.stamps"),
        ({"seqs": [1, 2]}, "$.seqs"),
        ({"seqs": [3, 2, 4]}, "$.seqs"),
    ],
)
def test_stamps_and_cursors_that_do_not_match_the_lines_are_refused(change, where):
    answer = {
        "type": "logs",
        "request_id": "r1",
        "allocation_id": 5,
        "lines": ["a", "b", "c"],
        "truncated": False,
        "error": None,
        **change,
    }
    with pytest.raises(protocol.ProtocolError) as error:
        protocol.validate_message(answer)
    assert error.value.path == where


def test_the_process_runtime_stamps_a_workloads_lines_as_it_captures_them(tmp_path, kill_sessions):
    runtime = ProcessRuntime(tmp_path / "state", as_agent_user=True)
    runtime.log_path(3).parent.mkdir(parents=True, exist_ok=True)
    runtime.log_path(3).write_text("from an earlier run\n")
    before = time.time()
    running = runtime.start(
        process_spec(3, command=["sh", "-c", "echo first; sleep 1.2; echo second; sleep 30"])
    )
    kill_sessions.append(running.pid)
    wait_for(lambda: "first" in runtime.logs(3, 10).lines)
    runtime.capture()
    out = wait_for(lambda: (o := runtime.logs(3, 10)).lines[-1:] == ["second"] and o, 10)
    assert out.lines == ["from an earlier run", "first", "second"]
    assert out.stamps is not None and out.stamps[0] is None  # found written: not known
    first, second = out.stamps[1], out.stamps[2]
    assert first is not None and second is not None
    assert before - 0.1 <= first <= second <= time.time()
    assert second - first >= 1.0  # stamped when captured, not all at once
    assert out.seqs == [1, 2, 3]
    assert runtime.logs(3, 10, before=3).lines == ["from an earlier run", "first"]


def test_a_rotation_loses_no_captured_line_and_a_restarted_agent_finds_them_unstamped(
    tmp_path, kill_sessions
):
    runtime = ProcessRuntime(tmp_path / "state", log_max_bytes=10, as_agent_user=True)
    running = runtime.start(process_spec(8, command=["sh", "-c", "echo first; echo second"]))
    kill_sessions.append(running.pid)
    wait_for(lambda: runtime.logs(8, 10).lines == ["first", "second"])
    runtime.maintain()  # captured, then copied to 8.log.1, 8.log emptied
    with runtime.log_path(8).open("a") as log:
        log.write("third\n")
    runtime.capture()
    out = runtime.logs(8, 10)
    assert out.lines == ["first", "second", "third"] and out.seqs == [1, 2, 3]
    assert all(ts is not None for ts in out.stamps or [])
    again = ProcessRuntime(tmp_path / "state", log_max_bytes=10, as_agent_user=True)
    found = again.logs(8, 10)  # an agent restarted: the files, without times
    assert found.lines == ["first", "second", "third"] and found.stamps == [None] * 3


def test_docker_s_own_stamps_are_read_and_a_line_without_one_is_kept_whole():
    from hostagent.runtime.docker import _docker_stamp

    ts, text = _docker_stamp("2026-05-28T20:26:40.250000000Z hello world")
    assert text == "hello world" and ts == pytest.approx(1_780_000_000.25)
    assert _docker_stamp("no stamp here") == (None, "no stamp here")
    assert _docker_stamp("2026-13-99T00:00:00Z bad") == (None, "2026-13-99T00:00:00Z bad")


def test_a_replica_restarted_on_its_allocation_goes_on_in_its_ring(tmp_path, kill_sessions):
    runtime = ProcessRuntime(tmp_path / "state", as_agent_user=True)
    first = runtime.start(process_spec(4, command=["sh", "-c", "echo run 1"]))
    kill_sessions.append(first.pid)
    wait_for(lambda: runtime.logs(4, 10).lines == ["run 1"])
    second = runtime.start(process_spec(4, command=["sh", "-c", "echo run 2"]))
    kill_sessions.append(second.pid)
    out = wait_for(lambda: (o := runtime.logs(4, 10)).lines == ["run 1", "run 2"] and o)
    assert out.seqs == [1, 2]  # the cursors a viewer holds stay valid
    assert all(ts is not None for ts in out.stamps or [None])
