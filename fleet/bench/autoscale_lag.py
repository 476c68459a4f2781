"""What scale-out lag the SLO tolerates: the replay simulated with the autoscaler's own rule, its
new replicas ready ``lag`` seconds after each decision, for a range of lags (pure).

The model: each replica serves at most ``concurrency`` requests at once; a request waits for the
first free slot (one queue, first come first served: the balancer's ``leastconn`` with perfect
knowledge, so slightly optimistic) and then takes its service time
(:func:`fleet.bench.autoscale_trace.service_s`). Every ``evaluate_every_s`` the policy's rule
(:func:`fleet.autoscaling.rule.decide`, the code the beat runs, with its scale-in stabilization)
sees the requests in flight and queued over the ready replicas; a scale-out's replicas serve
after ``lag``; a scale-in takes replicas out at once (they finish what they hold). The SLO is
the simulated static peak's p99 x 2, as in the measured run. The tolerated lag is the longest
one that keeps 99 % of requests within it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from fleet.autoscaling.rule import Limits, Observation, decide
from fleet.bench.autoscale_trace import Trace, service_s
from fleet.bench.replay import percentile

LAGS_S = (0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 20.0)


def simulate(
    trace: Trace,
    *,
    concurrency: int,
    start: int,
    limits: Limits | None = None,
    lag_s: float = 0.0,
    evaluate_every_s: float = 1.0,
) -> list[float]:
    """Each request's latency (ms), in arrival order; ``limits`` ``None``: ``start`` replicas
    throughout (a static mode)."""
    ready = start
    pending: list[float] = []  # when the replicas asked for become ready
    slots_free = ready * concurrency
    busy: list[float] = []  # heap of completion times
    queue: list[tuple[float, float]] = []  # (arrival, service) waiting, in order
    head = 0
    latencies: list[float] = []
    next_eval = evaluate_every_s
    last_out = last_in = None
    count = start
    wanted: list[tuple[float, int]] = []  # (when, desired): the scale-in stabilization

    def serve(now: float) -> None:
        nonlocal slots_free, head
        while slots_free > 0 and head < len(queue):
            arrived, service = queue[head]
            head += 1
            slots_free -= 1
            heapq.heappush(busy, now + service)
            latencies.append((now + service - arrived) * 1000.0)

    def advance(until: float) -> None:
        nonlocal slots_free, ready
        while True:
            events = [t for t in (busy[0] if busy else None, min(pending, default=None)) if t]
            t = min(events, default=None)
            if t is None or t > until:
                return
            if busy and busy[0] == t:
                heapq.heappop(busy)
                slots_free += 1
            else:
                pending.remove(t)
                ready += 1
                slots_free += concurrency
            serve(t)

    for arrival in [*trace.arrivals, None]:
        at = arrival.at_s if arrival is not None else float("inf")
        while limits is not None and next_eval <= at and next_eval < trace.seconds + 60:
            advance(next_eval)
            in_flight = len(busy) + len(queue) - head
            window = limits.scale_in_cooldown_s
            recent = [d for t, d in wanted if t >= next_eval - window]
            decision = decide(
                limits,
                Observation(
                    replicas=count,
                    ready=ready,
                    value=float(in_flight),
                    since_scale_out_s=None if last_out is None else next_eval - last_out,
                    since_scale_in_s=None if last_in is None else next_eval - last_in,
                    recent_desired=max(recent, default=None),
                ),
            )
            if decision.desired is not None:
                wanted = [
                    *(w for w in wanted if w[0] >= next_eval - window),
                    (next_eval, decision.desired),
                ]
            if decision.action == "out":
                pending.extend([next_eval + lag_s] * (decision.replicas - count))
                count, last_out = decision.replicas, next_eval
            elif decision.action == "in":
                gone = count - decision.replicas
                ready -= gone
                slots_free -= gone * concurrency  # may go negative: they finish what they hold
                count, last_in = decision.replicas, next_eval
            next_eval += evaluate_every_s
        if arrival is None:
            advance(float("inf"))
            break
        advance(at)
        queue.append((at, service_s(arrival)))
        serve(at)
    return latencies


def tolerated_lag(
    trace: Trace,
    *,
    concurrency: int,
    static_peak: int,
    start: int,
    limits: Limits,
    evaluate_every_s: float,
    lags: Sequence[float] = LAGS_S,
) -> dict[str, Any]:
    peak = simulate(trace, concurrency=concurrency, start=static_peak)
    slo = 2.0 * (percentile(peak, 99) or 0.0)
    rows = []
    for lag in lags:
        latencies = simulate(
            trace,
            concurrency=concurrency,
            start=start,
            limits=limits,
            lag_s=lag,
            evaluate_every_s=evaluate_every_s,
        )
        within = sum(1 for ms in latencies if ms <= slo) / max(1, len(latencies))
        rows.append({"lag_s": lag, "within_slo_percent": round(100.0 * within, 2)})
    ok = [r["lag_s"] for r in rows if r["within_slo_percent"] >= 99.0]
    most = max(ok, default=None)
    return {
        "model_slo_ms": round(slo, 1),
        "lags": rows,
        "tolerated_lag_s": most,
        "tolerated_lag_trace_s": None if most is None else round(most * trace.factor, 1),
    }
