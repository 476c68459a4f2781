"""The restart rules: pure (a replica record and a clock), then on the real Docker Engine."""

from __future__ import annotations

import dataclasses

import pytest

from hostagent.protocol import RESTART_BACKOFF_S
from hostagent.runtime import Exit, Timing
from hostagent.runtime.docker import DockerRuntime
from hostagent.runtime.operations import changed_parts
from hostagent.runtime.policy import Replica, backoff, on_check, on_exit, on_started, should_restart
from tests.hostagent.runtime.conftest import IMAGE
from tests.hostagent.runtime.fakes import exec_health, spec, wait_for, workload
from tests.hostagent.runtime.kit import allocation, desired, make_host

T = Timing()


@pytest.mark.parametrize(
    ("policy", "code", "restart"),
    [
        ("always", 0, True),
        ("always", 1, True),
        ("on-failure", 0, False),
        ("on-failure", 1, True),
        ("on-failure", -9, True),
        ("on-failure", None, True),  # unknown is not success
        ("never", 1, False),
        ("never", 0, False),
    ],
)
def test_restart_policy(policy, code, restart):
    assert should_restart(policy, code) is restart


def test_backoff_doubles_up_to_a_minute_and_stays_there():
    assert [backoff(T, n, False) for n in range(9)] == [*RESTART_BACKOFF_S, 60.0, 60.0]
    assert backoff(T, 0, True) == 60.0


def running_replica(now: float, **changes) -> Replica:
    r = Replica(1, spec(1, **changes))
    on_started(r, _running(), now)
    return r


def _running():
    from hostagent.runtime import Running

    return Running(1, "process", "w1", 0.0, None)


def test_five_failures_within_ten_minutes_are_a_crashloop_and_say_so_once():
    r, now, entered = running_replica(0.0), 0.0, []
    for _ in range(7):
        entered.append(on_exit(r, Exit(1), now, T))
        now = r.not_before
        on_started(r, _running(), now)
    assert entered == [False, False, False, False, True, False, False]
    assert r.state == "running" and r.streak == 7


def test_failures_spread_over_more_than_the_window_are_no_crashloop():
    r, now = running_replica(0.0), 0.0
    for _ in range(6):
        assert not on_exit(r, Exit(1), now, T)
        assert r.state == "pending"
        now += 200.0  # runs 200 s each time: 3 failures at most in any 10 minutes
        on_started(r, _running(), now)


def test_a_long_run_starts_the_backoff_again():
    r = running_replica(0.0)
    on_exit(r, Exit(1), 1.0, T)
    on_started(r, _running(), 2.0)
    on_exit(r, Exit(1), 3.0, T)
    assert r.not_before - 3.0 == RESTART_BACKOFF_S[1]
    on_started(r, _running(), 10.0)
    on_exit(r, Exit(1), 10.0 + T.stable_after_s, T)
    assert r.not_before - (10.0 + T.stable_after_s) == RESTART_BACKOFF_S[0]


def test_health_failures_in_the_start_period_do_not_count():
    r = running_replica(0.0, health=exec_health(interval_s=10, retries=1, start_period_s=30))
    assert r.state == "starting"
    assert not on_check(r, None, 1.0, T) and r.state == "running"
    assert not on_check(r, "down", 20.0, T)  # within the start period
    assert on_check(r, "down", 31.0, T)  # retries=1: stop it


def test_an_unhealthy_stop_is_a_failure_even_with_a_clean_exit():
    r = running_replica(0.0, restart="on-failure")
    r.stop_reason = "unhealthy"
    on_exit(r, Exit(0), 5.0, T)
    assert r.state == "pending" and len(r.failures) == 1
    assert "health check kept failing" in r.message


def test_a_container_exiting_non_zero_restarts_with_backoff_then_is_in_crashloop(
    tmp_path, docker_host
):
    host = make_host(
        tmp_path, {"container": DockerRuntime(docker_host, image_pull="if-not-present")}
    )
    try:
        failing = workload("container", image=IMAGE, command=["sh", "-c", "exit 3"])
        never = workload("container", image=IMAGE, command=["sh", "-c", "exit 5"], restart="never")
        host.apply(
            desired(
                host.gpu, 1, [allocation(1, failing), allocation(2, never, "p1")], ((5, 0), (5, 2))
            )
        )
        wait_for(lambda: host.state(1) == "crashloop", timeout_s=20)
        status = host.status(1)
        assert status["exit_code"] == 3 and status["restarts"] == 4
        assert [e["kind"] for e in host.supervisor.take_events()] == ["crashloop"]
        wait_for(lambda: host.state(2) == "exited")
        never_status = host.status(2)
        assert (never_status["exit_code"], never_status["restarts"]) == (5, 0)
    finally:
        host.supervisor.close()


def test_a_replacement_names_the_parts_of_the_launch_that_changed():
    started = spec(1)
    assert changed_parts(started.fingerprint(), started) == []
    moved = dataclasses.replace(started, device_uuid="MIG-other", gpu_request=True)
    assert changed_parts(started.fingerprint(), moved) == ["device_uuid", "gpu_request"]
    # Adopted with no launch known (or a fingerprint from before it had names): every part.
    assert changed_parts("", started) == sorted(started.fingerprint_parts())
    assert changed_parts("[1, 2]", started) == sorted(started.fingerprint_parts())


def test_checks_before_the_first_pass_come_sooner_right_after_the_start():
    from hostagent.runtime.policy import PRE_PASS_CHECK_S, PRE_PASS_FIRST_S, pre_pass_delay

    assert pre_pass_delay(0.0, 10.0) == PRE_PASS_FIRST_S
    assert pre_pass_delay(0.3, 10.0) == pytest.approx(0.15)
    assert pre_pass_delay(5.0, 10.0) == PRE_PASS_CHECK_S  # a slow start: once a second
    assert pre_pass_delay(5.0, 0.5) == 0.5  # never less often than the check's own interval
    times, at = [0.0], 0.0
    while at < 1.0:
        at += pre_pass_delay(at, 10.0)
        times.append(at)
    assert 5 <= len(times) <= 10  # several checks within the first second, not one
