"""``bench_endpoints``: its parts (the trace, the token server, the update-lag pairing) and a
CI-sized run end to end (its own stack, agents running the token server as processes, the
gateway's HAProxy, a replay of the Azure trace through it while every replica moves)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fleet.bench.gateway_watch import update_lags
from fleet.bench.processes import free_port, wait_until
from fleet.bench.replay import TRACE, load_trace, percentile, replay

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "fleet" / "bench" / "token_server.py"


def test_the_trace_is_compressed_to_the_seconds_asked(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.6805900,396,109\n"
        "2023-11-16 18:16:46.6805900,10,1\n"
    )
    arrivals = load_trace(trace, 6.0)
    assert [round(a.at_s, 3) for a in arrivals] == [0.0, 0.4, 6.0]
    assert (arrivals[1].context, arrivals[1].generated) == (396, 109)
    assert len(load_trace(trace, 6.0, limit=2)) == 2


def test_percentiles_are_nearest_rank():
    assert percentile([], 99) is None
    assert percentile([float(n) for n in range(1, 101)], 99) == 99.0
    assert percentile([5.0, 1.0], 50) == 1.0


def test_update_lag_pairs_each_fleet_change_with_the_balancer_following_it():
    events = [
        {"t": 10.0, "side": "fleet", "server": "ep_0/r1", "state": "ready"},
        {"t": 10.2, "side": "haproxy", "server": "ep_0/r1", "state": "ready"},
        {"t": 20.0, "side": "fleet", "server": "ep_0/r1", "state": "drain"},
        {"t": 20.5, "side": "haproxy", "server": "ep_0/r1", "state": "drain"},
        # Gone from Fleet's view while HAProxy still drains it: nothing for the balancer to do.
        {"t": 21.0, "side": "fleet", "server": "ep_0/r1", "state": "absent"},
        # HAProxy followed before the watcher saw Fleet's change: 0 ms, not negative.
        {"t": 30.0, "side": "haproxy", "server": "ep_0/r2", "state": "ready"},
        {"t": 30.01, "side": "fleet", "server": "ep_0/r2", "state": "ready"},
        # Never followed.
        {"t": 40.0, "side": "fleet", "server": "ep_0/r3", "state": "ready"},
    ]
    lags, missed = update_lags(events)
    assert [round(x) for x in lags] == [200, 500, 0]
    assert missed == 1


def test_the_report_blames_each_failure_on_the_change_it_overlapped(tmp_path):
    from fleet.bench.endpoint_changes import Change
    from fleet.bench.endpoint_report import report
    from fleet.bench.replay import Outcome, Replayer

    direct, through = Replayer([]), Replayer([])
    direct.outcomes = [Outcome(float(n), 100.5, 200, service_ms=100.0) for n in range(100)]
    through.outcomes = [Outcome(float(n), 101.0, 200, service_ms=100.0) for n in range(100)]
    through.outcomes += [
        Outcome(10.0, 5.0, 503),  # during the move
        Outcome(20.95, 100.0, 0, error="reset"),  # in flight when the replica was killed
        Outcome(40.0, 1.0, 0, error="refused"),  # outside every change
    ]
    move = Change("move", 9.0, 12.0, ok=True)
    kill = Change("kill-replica", 20.0, 25.0, {"killed_at": 21.0}, ok=True)
    events = tmp_path / "events.jsonl"
    events.write_text(
        '{"t": 1.0, "side": "fleet", "server": "ep_0/r1", "state": "ready"}\n'
        '{"t": 1.3, "side": "haproxy", "server": "ep_0/r1", "state": "ready"}\n'
    )
    result = report(
        direct=direct, through=through, changes=[move, kill], wanted=["move", "kill-replica"],
        events=events, origin=0.0, replay_ended=100.0, setup={},
    )  # fmt: skip
    assert (result["requests"], result["failed"]) == (103, 3)
    assert result["failed_during_changes"] == 1
    assert result["failed_on_killed_replica"] == 1
    assert result["failed_by_change"] == {"move": 1, "kill-replica": 1}
    assert result["failed_outside_changes"] == 1
    assert result["p99_overhead_ms"] == 0.5
    assert result["update_lag_ms"]["p99"] == 300.0
    assert result["goal_met"] is False
    assert result["goals"]["0 failed during moves, rollout and drain"] is False
    assert result["goals"]["p99 overhead under 2 ms"] is True


def _start_server(version: str = "7") -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-I", str(SERVER)],
        env={"FLEET_PORT_HTTP": str(port), "VERSION": version, "PATH": os.environ["PATH"]},
    )
    wait_until(lambda: _get(port, "/health")[0] == 200, 10, "the token server")
    return process, port


def _get(port: int, path: str) -> tuple[int, dict[str, object], dict[str, str]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read()), dict(answer.getheaders())
    finally:
        connection.close()


def test_the_token_server_takes_1_ms_per_10_tokens_and_finishes_its_requests_on_sigterm():
    process, port = _start_server()
    try:
        status, body, headers = _get(port, "/generate?context=1500&generated=500")
        assert status == 200 and body["tokens"] == 2000 and body["version"] == "7"
        assert 200 <= float(headers["X-Service-Ms"]) < 400
        assert int(str(headers["X-Replica"]).rsplit(":", 1)[1]) == process.pid
        assert _get(port, "/generate?context=x")[0] == 400
        outcome: list[int] = []
        slow = threading.Thread(
            target=lambda: outcome.append(_get(port, "/generate?context=8000")[0])
        )
        slow.start()
        time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        with pytest.raises(OSError):  # no new connection once it stops
            _get(port, "/health")
        slow.join(5)
        assert outcome == [200]  # the request in flight finished
        assert process.wait(5) == 0
    finally:
        process.kill()
        process.wait()


def test_a_replay_keeps_its_connections_alive_and_records_each_request():
    process, port = _start_server()
    try:
        arrivals = load_trace(TRACE, 2.0, limit=100)
        replayer = replay([("127.0.0.1", port, "/generate")], arrivals)
    finally:
        process.terminate()
        process.wait(10)
    assert len(replayer.outcomes) == 100 and all(o.ok for o in replayer.outcomes)
    assert all(o.service_ms is not None and o.latency_ms >= o.service_ms for o in replayer.outcomes)
    assert len({o.replica for o in replayer.outcomes}) == 1


def test_a_replay_reads_an_answer_without_a_length_to_the_end_of_its_connection():
    """busybox's httpd (the Docker mode's copies) answers a CGI script with no Content-Length
    and closes: the body ends there, and the connection is not kept."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    served: list[bytes] = []

    def serve() -> None:
        for _ in range(3):
            connection, _address = listener.accept()
            with connection:
                served.append(connection.recv(4096))
                connection.sendall(b"HTTP/1.1 200 OK\r\nX-Service-Ms: 5\r\n\r\n" + b"x" * 70000)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        arrivals = load_trace(TRACE, 0.5, limit=3)
        replayer = replay([("127.0.0.1", port, "/cgi-bin/generate")], arrivals)
    finally:
        thread.join(10)
        listener.close()
    assert [o.status for o in replayer.outcomes] == [200, 200, 200]
    assert all(o.service_ms == 5.0 for o in replayer.outcomes)
    assert len(served) == 3 and replayer.stale_retries == 0  # a new connection each


def test_the_docker_mode_copy_keeps_the_token_servers_service_time(tmp_path):
    """The CGI script the Docker mode's copies run, run here by a POSIX shell with a
    ``usleep`` of its own (busybox's, in the image)."""
    from fleet.bench.endpoints import CGI

    script = tmp_path / "generate"
    script.write_text(CGI)
    script.chmod(0o755)
    (tmp_path / "usleep").write_text('#!/bin/sh\necho "$1" > "$USLEPT"\n')
    (tmp_path / "usleep").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "USLEPT": str(tmp_path / "slept"), "VERSION": "4"}
    ok = subprocess.run(
        [str(script)], env={**env, "QUERY_STRING": "context=1500&generated=500"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert (tmp_path / "slept").read_text().strip() == "200000"  # 2,000 tokens: 200 ms
    assert "X-Service-Ms: 200\n" in ok.stdout and '"version": "4"' in ok.stdout
    bad = subprocess.run(
        [str(script)], env={**env, "QUERY_STRING": "context=1;reboot&generated=1"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert bad.stdout.startswith("Status: 400")


def test_bench_endpoints_refuses_bad_arguments():
    result = subprocess.run(
        [sys.executable, "manage.py", "bench_endpoints", "--changes", "move,teleport"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "fleet.settings.test"},
    )  # fmt: skip
    assert result.returncode != 0 and "unknown 'teleport'" in result.stderr


def _docker_answers() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.e2e
@pytest.mark.timeout(240)
@pytest.mark.parametrize("runtime", ["process", "docker"])
def test_bench_endpoints_ci_sized_run(tmp_path, runtime):
    """The copies as processes, then as containers on the local Docker Engine."""
    database_url = os.environ.get("FLEET_DATABASE_URL", "")
    if not database_url.startswith("postgres"):
        pytest.skip("bench_endpoints needs PostgreSQL: set FLEET_DATABASE_URL")
    for needed in ("redis-server", "haproxy"):
        if not shutil.which(needed):
            pytest.skip(f"bench_endpoints needs {needed}")
    if runtime == "docker" and not _docker_answers():
        pytest.skip("no Docker daemon answers (.ci/run starts one: dockerd --bridge=none)")
    if not TRACE.exists():
        pytest.skip(f"the Azure trace is not at {TRACE}")
    out = tmp_path / "bench.json"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "fleet.settings.test"}
    args = ["--seconds", "15", "--requests", "450", "--replicas", "2", "--hosts", "2",
            "--changes", "move,kill-replica", "--runtime", runtime]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "manage.py", "bench_endpoints", *args, "--json", str(out),
         "--workdir", str(tmp_path / "work"), "--timeout", "90"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=230,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(result.stdout) == report
    for key in ("requests", "failed", "failed_during_changes", "failed_on_killed_replica"):
        assert isinstance(report[key], int), key
    assert report["requests"] == 450
    assert report["setup"]["runtime"] == runtime
    assert set(report["update_lag_ms"]) >= {"p50", "p99"}
    assert report["update_lag_ms"]["count"] > 0
    assert isinstance(report["p99_overhead_ms"], float)
    assert set(report["latency_ms"]) == {"balancer", "direct"}
    assert [c["kind"] for c in report["changes"]] == ["move", "kill-replica"]
    assert all(c["ok"] for c in report["changes"]), report["changes"]
    assert report["changes"][0]["moves"] == 2
    assert report["failed_during_changes"] == 0, report
    assert report["failed"] == report["failed_on_killed_replica"], report
    assert isinstance(report["goal_met"], bool)
