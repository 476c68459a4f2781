"""The supervisor's state machine, with an in-memory runtime (the runtimes themselves are tested
against real processes and a real Docker Engine)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from hostagent import protocol
from hostagent.gpu.simulated import SimulatedBackend
from hostagent.protocol import LogsRequest
from hostagent.runtime import Exit, Found, ReplicaSpec, Running, Supervisor, Timing, WorkloadSync
from hostagent.runtime.store import ReplicaStore, Stored
from tests.hostagent.runtime.fakes import FakeRuntime, exec_health, spec, wait_for

FAST = Timing.scaled(0.01, poll_s=0.01)


@pytest.fixture
def runtime():
    return FakeRuntime()


@pytest.fixture
def supervisor(runtime, tmp_path):
    made = []

    def make(agent_runtime="process", runtimes=None, timing=FAST) -> Supervisor:
        s = Supervisor(
            {"process": runtime} if runtimes is None else runtimes,
            agent_runtime=agent_runtime,
            state_dir=tmp_path if not made else tmp_path / str(len(made)),
            timing=timing,
        )
        s.start()
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def state_of(s: Supervisor, allocation_id: int) -> str | None:
    return s.states().get(allocation_id)


def test_a_placed_replica_starts_once_however_often_it_is_placed(runtime, supervisor):
    s = supervisor()
    for _ in range(3):
        s.place("GPU-1", [spec(1)])
    wait_for(lambda: state_of(s, 1) == "running")
    s.place("GPU-1", [spec(1)])
    assert runtime.starts == [1]
    report = s.take_report(full=True)
    assert [(w["allocation_id"], w["state"], w["restarts"]) for w in report["workloads"]] == [
        (1, "running", 0)
    ]


def test_a_replica_exiting_non_zero_restarts_with_backoff_then_is_in_crashloop(runtime, supervisor):
    runtime.exit_on_start[1] = 3
    s = supervisor()
    s.place("GPU-1", [spec(1)])
    wait_for(lambda: state_of(s, 1) == "crashloop")
    events = s.take_events()
    assert [e["kind"] for e in events] == ["crashloop"]
    assert "qwen-7b replica 1" in events[0]["detail"]
    assert events[0]["gpu_uuid"] == "GPU-1"
    assert len(runtime.starts) == 5  # 5 failures within the window
    status = s.take_report(full=True)["workloads"][0]
    assert status["exit_code"] == 3 and status["restarts"] == 4
    # Still retried, at the longest backoff, without another event.
    wait_for(lambda: len(runtime.starts) >= 7, timeout_s=5)
    assert s.take_events() == []


def test_restart_never_leaves_the_replica_exited_with_its_code(runtime, supervisor):
    runtime.exit_on_start[1] = 7
    s = supervisor()
    s.place("GPU-1", [spec(1, restart="never")])
    wait_for(lambda: state_of(s, 1) == "exited")
    status = s.take_report(full=True)["workloads"][0]
    assert (status["exit_code"], status["restarts"], status["message"]) == (
        7,
        0,
        "exited with code 7",
    )
    assert runtime.starts == [1]


def test_on_failure_restarts_a_failure_but_not_a_clean_exit(runtime, supervisor):
    runtime.exit_on_start.update({1: 0, 2: 1})
    s = supervisor()
    s.place("GPU-1", [spec(1, restart="on-failure"), spec(2, restart="on-failure")])
    wait_for(lambda: state_of(s, 1) == "exited" and runtime.starts.count(2) >= 2)
    assert runtime.starts.count(1) == 1


def test_a_failed_start_says_why_and_is_tried_again(runtime, supervisor):
    runtime.fail_start[1] = "the image registry.example/llm:1.2 cannot be pulled"
    s = supervisor()
    s.place("GPU-1", [spec(1)])
    wait_for(lambda: runtime.starts.count(1) >= 3)
    status = s.take_report(full=True)["workloads"][0]
    assert status["state"] == "failed"
    assert status["message"].startswith("the image registry.example/llm:1.2 cannot be pulled")
    del runtime.fail_start[1]
    wait_for(lambda: state_of(s, 1) == "running")


def test_a_removed_replica_is_reported_stopping_then_none_and_then_forgotten(runtime, supervisor):
    runtime.stop_delay_s = 0.3
    s = supervisor()
    s.place("GPU-1", [spec(1, stop_grace_s=12)])
    wait_for(lambda: state_of(s, 1) == "running")
    s.take_report(full=True)
    live = s.release("GPU-1", [])
    assert live == [1]
    wait_for(lambda: state_of(s, 1) == "stopping")
    assert [w["state"] for w in s.take_report(full=False)["workloads"]] == ["stopping"]
    assert s.wait_stopped(live, timeout_s=5)
    final = s.take_report(full=False)["workloads"]
    assert [(w["state"], w["exit_code"]) for w in final] == [("none", -15)]
    assert runtime.stops == [(1, 12)]
    assert s.take_report(full=True)["workloads"] == []
    assert s.take_report(full=False) is None


def test_running_waits_for_the_health_check_and_failures_after_it_restart(runtime, supervisor):
    runtime.check_code = 1
    s = supervisor()
    s.place("GPU-1", [spec(1, health=exec_health(interval_s=1, retries=2))])
    wait_for(lambda: runtime.running_ids() == [1])
    wait_for(lambda: "not passed yet" in s.take_report(full=True)["workloads"][0]["message"])
    assert state_of(s, 1) == "starting"  # failing before a first pass: never running
    runtime.check_code = 0
    wait_for(lambda: state_of(s, 1) == "running")
    runtime.check_code = 1
    wait_for(lambda: runtime.starts.count(1) == 2)
    assert runtime.stops and runtime.stops[0][0] == 1


def test_a_workload_it_was_never_given_runs_on_until_a_desired_state_disowns_it(
    runtime, supervisor
):
    mine = Running(9, "process", "w-9", 1.0, None, "GPU-1", "old", 3)
    elsewhere = Running(8, "process", "w-8", 1.0, None, "GPU-2", "old", 3)
    runtime.live.update({mine.ident: mine, elsewhere.ident: elsewhere})
    runtime.found = [Found(mine, None), Found(elsewhere, None)]
    s = supervisor()
    wait_for(lambda: state_of(s, 9) == "running" and state_of(s, 8) == "running")
    s.take_report(full=True)
    time.sleep(0.2)  # the control plane is silent: nothing is stopped
    assert runtime.stops == [] and s.take_events() == []
    s.place("GPU-1", [spec(1)])  # a desired state for GPU-1 that does not list 9
    s.authorize(["GPU-1"])
    wait_for(lambda: state_of(s, 9) is None)
    assert runtime.stops == [(9, 3)]
    assert [e["kind"] for e in s.take_events()] == ["orphan_stopped"]
    assert {w["allocation_id"]: w["state"] for w in s.take_report(False)["workloads"]}[9] == "none"
    assert state_of(s, 8) == "running"  # GPU-2 was not in that desired state


def test_a_saved_replica_found_running_is_supervised_before_the_control_plane_answers(
    runtime, supervisor, tmp_path
):
    ReplicaStore(tmp_path).save([Stored(spec(1), restarts=2)])
    adopted = Running(1, "process", "w-old", 1.0, None, "GPU-1", "qwen-7b", 30)
    runtime.live[adopted.ident] = adopted
    runtime.found = [Found(adopted, None)]
    s = supervisor()
    wait_for(lambda: state_of(s, 1) == "running")
    assert runtime.starts == []  # adopted, not started again
    runtime.exit(1, 1)
    wait_for(lambda: runtime.starts == [1])  # restarted by its policy, no server needed
    assert s.take_report(full=True)["workloads"][0]["restarts"] == 3


def test_the_store_keeps_how_a_replica_is_confined_so_that_its_fingerprint_survives(tmp_path):
    import dataclasses

    confined = dataclasses.replace(
        spec(1),
        security={**protocol.default_security(), "user": "65534:65534", "memory_mib": 512},
    )
    ReplicaStore(tmp_path).save([Stored(confined, restarts=0)])

    loaded = ReplicaStore(tmp_path).load()[1].spec
    assert loaded.security == confined.security
    # An agent restarted after a crash adopts what it left running, it does not start it again.
    assert loaded.fingerprint() == confined.fingerprint()


def test_a_saved_replica_not_running_waits_for_the_control_plane(runtime, supervisor, tmp_path):
    ReplicaStore(tmp_path).save([Stored(spec(1), restarts=0)])
    ended = Running(1, "process", "w-old", 1.0, None, "GPU-1", "qwen-7b", 30)
    runtime.found = [Found(ended, Exit(0))]
    s = supervisor()
    wait_for(
        lambda: "waiting for the control plane" in s.take_report(True)["workloads"][0]["message"]
    )
    assert runtime.starts == []
    s.place("GPU-1", [spec(1)])
    s.authorize(["GPU-1"])
    wait_for(lambda: state_of(s, 1) == "running")


def test_a_workload_this_agent_cannot_run_is_failed_with_the_reason(supervisor):
    none_agent = supervisor(agent_runtime="none", runtimes={})
    none_agent.place("GPU-1", [spec(1)])
    status = none_agent.take_report(full=True)["workloads"][0]
    assert status["state"] == "failed" and "--runtime none" in status["message"]
    process_agent = supervisor()
    process_agent.place("GPU-1", [spec(2, runtime="container", image="busybox")])
    status = process_agent.take_report(full=True)["workloads"][0]
    assert status["state"] == "failed"
    assert "needs an agent with the docker runtime" in status["message"]


def test_a_changed_spec_starts_the_replica_again(runtime, supervisor):
    s = supervisor()
    s.place("GPU-1", [spec(1)])
    wait_for(lambda: state_of(s, 1) == "running")
    s.place("GPU-1", [spec(1, command=["serve", "--new"])])
    wait_for(lambda: runtime.starts == [1, 1] and state_of(s, 1) == "running")
    assert [a for a, _ in runtime.stops] == [1]


def test_a_runtime_that_breaks_on_one_replica_leaves_the_others_running(runtime, supervisor):
    original = runtime.start

    def start(s):
        if s.allocation_id == 2:
            raise OSError("the Docker daemon went away")
        return original(s)

    runtime.start = start
    s = supervisor()
    s.place("GPU-1", [spec(1), spec(2)])
    wait_for(lambda: state_of(s, 1) == "running" and state_of(s, 2) == "failed")
    status = {w["allocation_id"]: w for w in s.take_report(full=True)["workloads"]}
    assert "OSError: the Docker daemon went away" in status[2]["message"]


def test_stopped_replicas_are_waited_for_only_as_long_as_their_grace(runtime, supervisor):
    runtime.stop_delay_s = 2.0
    s = supervisor()
    s.place("GPU-1", [spec(1, stop_grace_s=0)])
    wait_for(lambda: state_of(s, 1) == "running")
    live = s.release("GPU-1", [])
    assert not s.wait_stopped(live, timeout_s=0.2)
    assert s.wait_stopped(live, timeout_s=5)


def _logs_request(allocation_id: int, tail: int = 200) -> LogsRequest:
    return {
        "type": "logs_request",
        "request_id": "r1",
        "allocation_id": allocation_id,
        "tail": tail,
    }


def test_a_logs_request_is_answered_with_the_replicas_newest_lines_within_bounds(
    supervisor, runtime
):
    s = supervisor()
    s.place("GPU-1", [spec(4)])
    wait_for(lambda: s.states()[4] == "running")
    runtime.output[4] = ["old", "x" * 10_000, "new"]
    sync = WorkloadSync(s, SimulatedBackend([]), gpu_request=False)
    answer = sync.logs(_logs_request(4, 2))
    assert answer["request_id"] == "r1" and answer["allocation_id"] == 4
    assert answer["lines"] == ["x" * 4095 + "…", "new"]
    assert answer["truncated"] and answer["error"] is None
    assert protocol.decode(protocol.encode(answer)) == answer


def test_a_logs_request_for_an_unknown_replica_or_one_without_output_says_why(supervisor, runtime):
    s = supervisor()
    s.place("GPU-1", [spec(4)])
    sync = WorkloadSync(s, SimulatedBackend([]), gpu_request=False)
    unknown = sync.logs(_logs_request(9))
    assert unknown["lines"] == [] and unknown["error"] == "allocation 9 is not on this host"
    silent = sync.logs(_logs_request(4))
    assert silent["lines"] == [] and "no output yet" in str(silent["error"])


def test_a_runtime_failing_to_read_costs_only_that_answer(supervisor, runtime, monkeypatch):
    s = supervisor()
    s.place("GPU-1", [spec(4)])

    def broken(allocation_id: int, tail: int, *, before: int | None = None) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(runtime, "logs", broken)
    answer = WorkloadSync(s, SimulatedBackend([]), gpu_request=False).logs(_logs_request(4))
    assert answer["lines"] == [] and "disk on fire" in str(answer["error"])


def test_a_removed_replica_drains_reported_stopping_before_its_sigterm(runtime, supervisor):
    s = supervisor()
    s.place("GPU-1", [dataclasses.replace(spec(1, stop_grace_s=7), drain_s=1)])
    wait_for(lambda: state_of(s, 1) == "running")
    assert s.stop_grace_s([1]) == 8  # what an apply waits for: the drain, then the grace
    released_at = time.monotonic()
    live = s.release("GPU-1", [])
    wait_for(lambda: state_of(s, 1) == "stopping")  # the balancers take it out of rotation
    time.sleep(0.5)
    assert runtime.stops == []  # still serving what it has in flight
    assert s.wait_stopped(live, timeout_s=5)
    assert runtime.stops == [(1, 7)] and time.monotonic() - released_at >= 1.0


def test_a_replica_wanted_again_while_it_drains_runs_on(runtime, supervisor):
    s = supervisor()
    drained = dataclasses.replace(spec(1), drain_s=2)
    s.place("GPU-1", [drained])
    wait_for(lambda: state_of(s, 1) == "running")
    s.release("GPU-1", [])
    wait_for(lambda: state_of(s, 1) == "stopping")
    s.place("GPU-1", [drained])
    wait_for(lambda: state_of(s, 1) == "running")
    time.sleep(2.2)
    assert runtime.stops == [] and runtime.starts == [1]


def _counting(counts):
    """A connection count for every look, the last one repeated; records when it was asked."""
    asked: list[float] = []

    def connections(running, spec):
        asked.append(time.monotonic())
        return counts[min(len(asked), len(counts)) - 1]

    return connections, asked


def _counted_supervisor(runtime, tmp_path, connections) -> Supervisor:
    s = Supervisor(
        {"process": runtime},
        agent_runtime="process",
        timing=FAST,
        connections=connections,
        state_dir=tmp_path,
    )
    s.start()
    return s


def test_a_drain_ends_once_no_connection_is_open_on_the_replicas_ports(runtime, tmp_path):
    connections, asked = _counting([2, 2, 1, 0])
    s = _counted_supervisor(runtime, tmp_path, connections)
    try:
        s.place("GPU-1", [dataclasses.replace(spec(1, stop_grace_s=7), drain_s=30)])
        wait_for(lambda: state_of(s, 1) == "running")
        released_at = time.monotonic()
        live = s.release("GPU-1", [])
        assert s.wait_stopped(live, timeout_s=5)  # not the drain's 30 s
        took = time.monotonic() - released_at
        assert runtime.stops == [(1, 7)]
        # Not before the balancers had their time, and only once the count reached 0.
        assert took >= s.timing.drain_settle_s and len(asked) >= 4
    finally:
        s.close()


@pytest.mark.parametrize("count", [None, 1, RuntimeError("no /proc")])
def test_a_drain_runs_its_full_length_while_a_connection_is_open_or_nobody_knows(
    runtime, tmp_path, count
):
    def connections(running, spec):
        if isinstance(count, Exception):
            raise count
        return count

    s = _counted_supervisor(runtime, tmp_path, connections)
    try:
        s.place("GPU-1", [dataclasses.replace(spec(1), drain_s=1)])
        wait_for(lambda: state_of(s, 1) == "running")
        released_at = time.monotonic()
        live = s.release("GPU-1", [])
        assert s.wait_stopped(live, timeout_s=5)
        assert time.monotonic() - released_at >= 1.0
    finally:
        s.close()


def test_a_replica_only_renumbered_runs_on_and_any_other_change_replaces_it(runtime, supervisor):
    s = supervisor()

    def numbered(index: int, **env: str) -> ReplicaSpec:
        base = spec(1)
        environment = {**base.environment, "FLEET_REPLICA": str(index), **env}
        return dataclasses.replace(
            base, replica=index, key=f"a1:qwen-7b[{index}]", environment=environment
        )

    s.place("GPU-1", [numbered(3)])
    wait_for(lambda: state_of(s, 1) == "running")
    # A scale-in took replica 1 away: the last one (3) takes its number.
    s.place("GPU-1", [numbered(1)])
    time.sleep(0.3)
    assert runtime.starts == [1] and runtime.stops == [] and state_of(s, 1) == "running"
    # Anything else that changes how it runs still replaces it.
    s.place("GPU-1", [numbered(1, MODEL="llama")])
    wait_for(lambda: len(runtime.starts) == 2)
    assert [stop[0] for stop in runtime.stops] == [1]
