"""The autoscaling decision rule (issue 24): target tracking with a ±10 % tolerance, fast
scale-out and slow scale-in, min and max, and replicas that are not ready left out."""

from __future__ import annotations

import pytest

from fleet.autoscaling.rule import Decision, Limits, Observation, decide

LIMITS = Limits(min=1, max=8, target=4.0, scale_out_cooldown_s=30, scale_in_cooldown_s=300)


def at(replicas: int, value: float | None, ready: int | None = None, **since) -> Decision:
    obs = Observation(replicas, replicas if ready is None else ready, value, **since)
    return decide(LIMITS, obs)


def test_desired_is_the_ceiling_of_demand_over_the_target():
    d = at(2, 16.0)  # 8 req/s per replica, target 4
    assert (d.action, d.replicas, d.per_replica, d.desired) == ("out", 4, 8.0, 4)
    assert at(2, 17.0).replicas == 5  # ceil(17 / 4)
    d = at(4, 6.0, since_scale_out_s=400, since_scale_in_s=400)  # 1.5 per replica
    assert (d.action, d.replicas) == ("in", 2)


@pytest.mark.parametrize("value", [7.3, 8.0, 8.7])
def test_within_ten_percent_of_the_target_nothing_changes(value):
    d = at(2, value, since_scale_out_s=1000, since_scale_in_s=1000)
    assert d.action == "hold" and d.replicas == 2 and "10 %" in d.reason


def test_just_past_the_tolerance_it_scales():
    assert at(2, 8.9).action == "out"
    assert at(3, 7.1, since_scale_out_s=1000).replicas == 2
    # Below the target, but one replica fewer would be past it: the count stays.
    d = at(2, 7.1, since_scale_out_s=1000)
    assert d.action == "hold" and "meet the target" in d.reason


def test_scale_out_waits_its_cooldown_and_scale_in_waits_longer_after_any_scaling():
    d = at(2, 16.0, since_scale_out_s=10)
    assert d.action == "hold" and "scale-out cooldown" in d.reason
    assert at(2, 16.0, since_scale_out_s=31).action == "out"
    assert at(2, 16.0, since_scale_in_s=5).action == "out"  # a scale-in does not slow it
    d = at(4, 4.0, since_scale_out_s=120)
    assert d.action == "hold" and "scale-in cooldown" in d.reason
    d = at(4, 4.0, since_scale_out_s=1000, since_scale_in_s=100)
    assert d.action == "hold" and "scale-in cooldown" in d.reason
    assert at(4, 4.0, since_scale_out_s=301, since_scale_in_s=301).action == "in"


def test_bounds_hold_and_a_count_outside_them_comes_back_at_once():
    d = at(8, 80.0)
    assert (d.action, d.replicas) == ("hold", 8) and "maximum" in d.reason
    assert at(7, 80.0).replicas == 8  # capped, not 20
    d = at(1, 0.0, since_scale_out_s=1000)
    assert (d.action, d.replicas) == ("hold", 1) and "minimum" in d.reason
    assert at(3, 0.0, since_scale_out_s=1000).replicas == 1
    assert decide(LIMITS, Observation(12, 12, 4.0)).replicas == 8  # the policy was lowered
    assert decide(LIMITS, Observation(0, 0, None)).replicas == 1  # and even with no metric


def test_replicas_not_ready_do_not_count():
    # 4 replicas, 2 ready at 8 req/s each: the 2 starting ones are already what is needed.
    d = at(4, 16.0, ready=2)
    assert d.action == "hold" and "starting" in d.reason
    # The ready two now take 12 req/s each: 6 are needed, even counting the starting ones.
    assert at(4, 24.0, ready=2).replicas == 6
    # Little traffic, but a replica still starting: no scale-in until every one is ready.
    d = at(4, 1.0, ready=3, since_scale_out_s=1000)
    assert d.action == "hold" and "not ready" in d.reason
    d = at(2, 16.0, ready=0)
    assert d.action == "hold" and "no replica is ready" in d.reason


def test_no_metric_changes_nothing():
    d = at(3, None)
    assert d.action == "hold" and d.replicas == 3 and "no value" in d.reason


def test_a_mean_metric_is_not_divided_by_the_replicas():
    limits = Limits(min=1, max=10, target=60.0)
    d = decide(limits, Observation(2, 2, 90.0, additive=False))  # 90 % on each of 2
    assert (d.action, d.replicas, d.per_replica) == ("out", 3, 90.0)


def test_scale_to_zero_and_back_on_the_first_requests():
    zero = Limits(min=0, max=8, target=4.0, scale_in_cooldown_s=300)
    idle = decide(zero, Observation(1, 1, 0.0, since_scale_out_s=400, since_scale_in_s=400))
    assert (idle.action, idle.replicas) == ("in", 0)
    cooling = decide(zero, Observation(1, 1, 0.0, since_scale_out_s=100))
    assert cooling.action == "hold" and "cooldown" in cooling.reason
    asleep = decide(zero, Observation(0, 0, 0.0))
    assert (asleep.action, asleep.replicas) == ("hold", 0) and "zero" in asleep.reason
    # Requests held at the endpoint count: back at once, as many as they need, no cooldown.
    woken = decide(zero, Observation(0, 0, 13.0, since_scale_out_s=1, since_scale_in_s=1))
    assert (woken.action, woken.replicas) == ("out", 4)
    assert decide(zero, Observation(0, 0, 0.2)).replicas == 1
    assert decide(zero, Observation(0, 0, 900.0)).replicas == 8


def test_scale_in_goes_no_lower_than_the_most_wanted_over_the_scale_in_window():
    """The HPA's scale-down stabilization: one quiet reading between two bursts does not take
    away the replicas the next burst needs."""
    quiet = {"since_scale_out_s": 400, "since_scale_in_s": 400}
    assert at(8, 0.5, **quiet).replicas == 1  # no window known: this reading alone
    d = at(8, 0.5, recent_desired=6, **quiet)
    assert (d.action, d.replicas) == ("in", 6)
    d = at(8, 0.5, recent_desired=9, **quiet)  # wanted more than it has: it stays
    assert d.action == "hold" and "stabilization" in d.reason
    assert at(8, 0.5, recent_desired=0, **quiet).replicas == 1  # still bounded by min
    # Scale-out does not look back.
    assert at(2, 40.0, recent_desired=2).replicas == 8


def test_a_replica_metric_averaged_over_the_ready_replicas_tracks_its_target():
    # vllm:num_requests_waiting averaged (not additive) over 3 ready replicas of 4, target 5.
    limits = Limits(min=1, max=10, target=5.0, scale_out_cooldown_s=0, scale_in_cooldown_s=60)
    d = decide(limits, Observation(4, 3, 10.0, additive=False))
    assert (d.action, d.replicas, d.per_replica, d.desired) == ("out", 6, 10.0, 6)
    # Summed, the same total spread over the ready replicas: 30 waiting on 3 ready.
    d = decide(limits, Observation(4, 3, 30.0, additive=True))
    assert (d.action, d.replicas, d.per_replica) == ("out", 6, 10.0)
    # No replica reports it: nothing changes, whatever the count.
    d = decide(limits, Observation(4, 3, None, additive=False))
    assert d.action == "hold" and d.replicas == 4
    # Below the target with replicas still starting: no scale-in.
    d = decide(limits, Observation(4, 3, 1.0, additive=False, since_scale_out_s=600))
    assert d.action == "hold" and "not ready" in d.reason


def test_a_step_limit_adds_at_most_its_step_or_a_doubling_per_scale_out():
    limits = Limits(min=1, max=16, target=5.0, scale_out_cooldown_s=1, max_step_out=4)
    d = decide(limits, Observation(1, 1, 80.0))  # the queue says 16
    assert (d.action, d.replicas, d.desired) == ("out", 5, 16) and "a step of 4" in d.reason
    d = decide(limits, Observation(6, 6, 80.0, since_scale_out_s=2))  # 6 doubles to 12
    assert (d.action, d.replicas) == ("out", 12)
    d = decide(limits, Observation(12, 12, 80.0, since_scale_out_s=2))
    assert (d.action, d.replicas) == ("out", 16)  # the maximum bounds it still
    d = decide(limits, Observation(5, 5, 30.0, since_scale_out_s=0.5))
    assert d.action == "hold" and "cooldown" in d.reason  # one step per cooldown
    # Without a limit the same reading goes straight to 16; from zero it never applies.
    assert decide(Limits(min=1, max=16, target=5.0), Observation(1, 1, 80.0)).replicas == 16
    at_zero = decide(Limits(min=0, max=16, target=5.0, max_step_out=4), Observation(0, 0, 80.0))
    assert at_zero.replicas == 16
