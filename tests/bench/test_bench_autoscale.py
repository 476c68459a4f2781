"""``bench_autoscale``'s pure parts (issue 24): the static modes' sizes from the trace's minutes,
the sharpened burst, the lag model driven by the autoscaler's own rule, the SLO and the goals.
The benchmark itself starts a whole stack for minutes: it is run by hand (docs/benchmarks.md)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from fleet.autoscaling.rule import Limits
from fleet.bench.autoscale import AutoscaleOptions, policy
from fleet.bench.autoscale_lag import run_model
from fleet.bench.autoscale_report import report
from fleet.bench.autoscale_trace import (
    TRACES,
    Trace,
    load_replay,
    mean_service_s,
    service_s,
    sharpened,
    static_sizes,
    window_loads,
)
from fleet.bench.replay import Arrival, percentile


def _trace() -> Trace:
    """60 s of replay for 600 s of trace (x10, a trace minute is 6 s): 1 request/s of 100 ms,
    with a burst of 20 requests/s between 30 and 36 s."""
    arrivals = [Arrival(float(t), 500, 500) for t in range(60)]
    arrivals += [Arrival(30.0 + i / 20.0, 500, 500) for i in range(120)]
    return Trace("test", sorted(arrivals, key=lambda a: a.at_s), 60.0, 600.0)


def test_the_static_modes_are_sized_from_the_trace_minutes() -> None:
    trace = _trace()
    assert service_s(trace.arrivals[0]) == pytest.approx(0.1)
    assert trace.factor == 10.0 and trace.minute_s == 6.0
    loads = window_loads(trace.arrivals, trace.minute_s, trace.seconds)
    assert len(loads) == 10
    assert loads[5] == pytest.approx((6 + 120) * 0.1 / 6)  # the burst's minute: 2.1 in flight
    assert loads[0] == pytest.approx(0.1)
    assert static_sizes(trace, target=0.5) == {"static_peak": 5, "static_median": 1}


def test_sharpening_doubles_the_busiest_30_trace_seconds() -> None:
    trace = _trace()
    sharp, at = sharpened(trace)
    assert sharp.sharpened and 30.0 <= at < 36.0
    window = 30.0 / trace.factor
    inside = [a for a in sharp.arrivals if at <= a.at_s < at + window]
    before = [a for a in trace.arrivals if at <= a.at_s < at + window]
    assert len(inside) == 2 * len(before)
    assert len(sharp.arrivals) == len(trace.arrivals) + len(before)


def test_the_lag_model_scales_with_the_rule_and_a_longer_lag_costs_latency() -> None:
    trace = _trace()
    static = run_model(trace, concurrency=1, start=1).latencies_ms
    assert len(static) == len(trace.arrivals)
    assert min(static) == pytest.approx(100.0)  # alone, a request takes its service time
    limits = Limits(min=1, max=8, target=0.5, scale_out_cooldown_s=1, scale_in_cooldown_s=5)
    quick = run_model(trace, concurrency=1, start=1, limits=limits, lag_s=0.0).latencies_ms
    slow = run_model(trace, concurrency=1, start=1, limits=limits, lag_s=5.0).latencies_ms
    assert max(quick) < max(static)
    assert max(quick) < max(slow)


def test_the_lag_model_counts_replica_seconds_from_each_decision() -> None:
    """Four 10 s requests at 0.5 s, one slot per replica, 30 s of replay: the evaluation at 1 s
    reads 4 in flight on 1 ready replica (target 1) and asks for 4, ready at 3 s; the scale-in
    cooldown (100 s, from the policy's setting at 0) keeps them to the end."""
    trace = Trace("test", [Arrival(0.5, 50_000, 50_000) for _ in range(4)], 30.0, 300.0)
    static = run_model(trace, concurrency=1, start=2)
    assert static.duration_s == 30.0 and static.events == []
    assert static.replica_seconds == pytest.approx(2 * 30.0)  # start x the replay
    limits = Limits(min=1, max=8, target=1, scale_out_cooldown_s=1, scale_in_cooldown_s=100)
    auto = run_model(trace, concurrency=1, start=1, limits=limits, lag_s=2.0)
    assert auto.events == [(1.0, 1, 4)]
    assert auto.replica_seconds == pytest.approx(1 * 1.0 + 4 * 29.0)  # starting ones included
    assert auto.latencies_ms == pytest.approx([10_000.0, 12_500.0, 12_500.0, 12_500.0])
    assert (
        auto.latencies_ms
        == run_model(trace, concurrency=1, start=1, limits=limits, lag_s=2.0).latencies_ms
    )
    # A replay whose last answer comes after trace.seconds counts to that answer.
    slow = run_model(trace, concurrency=1, start=1)
    assert slow.duration_s == pytest.approx(40.5) and slow.replica_seconds == pytest.approx(40.5)
    # A scale-in's replicas count their drain too: with a 5 s scale-in window, the 4 replicas
    # go back to 1 once the requests are answered (3 removed, each 2 s more).
    quick = Limits(min=1, max=8, target=1, scale_out_cooldown_s=1, scale_in_cooldown_s=5)
    drained = run_model(trace, concurrency=1, start=1, limits=quick, lag_s=2.0, drain_s=2.0)
    kept = run_model(trace, concurrency=1, start=1, limits=quick, lag_s=2.0)
    assert drained.events == kept.events and drained.events[-1][2] == 1
    assert drained.replica_seconds == pytest.approx(kept.replica_seconds + 3 * 2.0)


def _mode(latencies: list[float], seconds: float, failed: int = 0) -> dict[str, Any]:
    return {
        "requests": len(latencies),
        "failed": failed,
        "p99_ms": percentile(latencies, 99),
        "replica_seconds": seconds,
        "gpu_equivalent_hours": seconds / 3600,
        "_latencies": latencies,
        "_failed": [n < failed for n in range(len(latencies))],
    }


def test_the_slo_is_twice_static_peaks_p99_and_the_goals_follow() -> None:
    result = report(
        {
            "static_peak": _mode([100.0] * 99 + [200.0], 1000.0),
            "static_median": _mode([100.0] * 90 + [900.0] * 10, 300.0),
            "autoscale": _mode([100.0] * 100, 600.0),
        },
        setup={"trace": "code", "compression": 10.0},
        lag_model={"tolerated_lag_s": 2.0},
    )
    assert result["slo_ms"] == 200.0
    assert result["static_median"]["over_slo"] == 10
    assert result["static_median"]["over_slo_percent"] == 10.0
    assert result["autoscale"]["over_slo"] == 0
    assert result["autoscale"]["gpu_equivalent_hours_trace_time"] == pytest.approx(1.6667)
    assert result["saving_vs_static_peak"] == 0.4
    assert result["goals"] == {
        "autoscale_saves_35_percent": True,
        "autoscale_within_slo_99_percent": True,
        "autoscale_0_failed": True,
        "static_median_misses_slo": True,
    }
    assert result["goal_met"] is True
    failing = report(
        {"static_peak": _mode([100.0] * 100, 1000.0), "autoscale": _mode([100.0] * 100, 900, 1)},
        setup={"trace": "conv", "compression": 10.0},
        lag_model={},
    )
    assert failing["goals"]["autoscale_saves_35_percent"] is False
    assert failing["goals"]["autoscale_0_failed"] is False
    assert failing["goal_met"] is False


def test_the_command_refuses_bad_options_before_starting_anything() -> None:
    for args, message in (
        (["--modes", "autoscale,static_peak"], "static_peak runs first"),
        (["--modes", "surge"], "unknown"),
        (["--seconds", "2"], "--seconds"),
        (["--target", "9"], "--target"),
        (["--rate-target", "0"], "--rate-target"),
        (["--trace-minutes", "0.5"], "--trace-minutes"),
        (["--scale-in-cooldown", "-1"], "--scale-in-cooldown"),
        (["--database-url", "sqlite://"], "needs PostgreSQL"),
    ):
        with pytest.raises(CommandError, match=message):
            call_command("bench_autoscale", *args, stdout=SimpleNamespace(write=print))


def test_a_rate_target_keeps_the_in_flight_target_by_littles_law() -> None:
    trace = _trace()  # every request 100 ms
    assert mean_service_s(trace) == pytest.approx(0.1)
    rate = policy(AutoscaleOptions(metric="requests", target=5.0), trace, 16)
    assert rate["target"] == {"requests_per_replica_per_s": 50.0}  # 5 in flight / 0.1 s
    fixed = policy(AutoscaleOptions(metric="requests", rate_target=12.0), trace, 16)
    assert fixed["target"] == {"requests_per_replica_per_s": 12.0}
    assert policy(AutoscaleOptions(), trace, 16)["target"] == {"in_flight_per_replica": 5.0}
    # The scale-in cooldown is given in trace time and compressed with the trace.
    short = policy(AutoscaleOptions(scale_in_cooldown_s=60.0), trace, 16)
    assert short["scale_in_cooldown_s"] == round(60.0 / trace.factor)


@pytest.mark.skipif(not TRACES["code"].is_file(), reason="the Azure trace is not here")
def test_the_first_trace_minutes_replay_with_a_milder_compression() -> None:
    whole = load_replay("code", 60.0)
    first = load_replay("code", 60.0, minutes=15)
    assert first.span_s == 900.0 and first.factor == pytest.approx(15.0)
    assert whole.factor > 50
    assert 0 < len(first.arrivals) < len(whole.arrivals)
    assert max(a.at_s for a in first.arrivals) <= 60.0 + 1e-9
    # The same requests as the whole trace's first 15 minutes, in the same order.
    assert [(a.context, a.generated) for a in first.arrivals] == [
        (a.context, a.generated) for a in whole.arrivals[: len(first.arrivals)]
    ]
