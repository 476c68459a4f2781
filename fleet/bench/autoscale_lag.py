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

:func:`run_model` also counts the **replica-seconds** the replay holds, as the usage module would
without the drain: the replica count the autoscaler asked for, integrated from the start of the
replay to its end (its last answer, and not before ``trace.seconds``); a replica counts from the
decision that created it (starting included) to the decision that removed it, plus ``drain_s``
(how long a removed replica stays up draining: the usage module counts it); a static mode
holds ``start`` replicas throughout. A policy is set as the replay starts, and its first
scale-in waits its cooldown from then (as :mod:`fleet.autoscaling.services` counts a policy's
creation).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleet.autoscaling.rule import Limits, Observation, decide
from fleet.bench.autoscale_trace import Trace, service_s
from fleet.bench.replay import percentile

LAGS_S = (0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 20.0)


@dataclass(frozen=True)
class ModelRun:
    """One simulated replay: each request's latency (ms, in the order they were served, which
    is their arrival order), the replica-seconds held, and the scale decisions."""

    latencies_ms: list[float]
    replica_seconds: float
    duration_s: float  # the replay's start to its end: its last answer, trace.seconds at least
    events: list[tuple[float, int, int]]  # (at, from, to): each decision that changed the count

    @property
    def mean_replicas(self) -> float:
        return self.replica_seconds / self.duration_s if self.duration_s > 0 else 0.0


def run_model(
    trace: Trace,
    *,
    concurrency: int,
    start: int,
    limits: Limits | None = None,
    lag_s: float = 0.0,
    evaluate_every_s: float = 1.0,
    policy_set_at_s: float | None = 0.0,
    drain_s: float = 0.0,
) -> ModelRun:
    """The replay simulated (see the module's docstring); ``limits`` ``None``: ``start``
    replicas throughout (a static mode). ``policy_set_at_s``: when the policy was set, its first
    scale-in waiting its cooldown from then (the product's rule); ``None``: not counted (the
    first reading may scale in, as before that rule)."""
    ready = start
    pending: list[float] = []  # when the replicas asked for become ready
    slots_free = ready * concurrency
    busy: list[float] = []  # heap of completion times
    queue: list[tuple[float, float]] = []  # (arrival, service) waiting, in order
    head = 0
    latencies: list[float] = []
    next_eval = evaluate_every_s
    last_out: float | None = None
    last_in = policy_set_at_s
    count = start
    events: list[tuple[float, int, int]] = []
    last_done = 0.0
    wanted: list[tuple[float, int]] = []  # (when, desired): the scale-in stabilization

    def serve(now: float) -> None:
        nonlocal slots_free, head, last_done
        while slots_free > 0 and head < len(queue):
            arrived, service = queue[head]
            head += 1
            slots_free -= 1
            heapq.heappush(busy, now + service)
            latencies.append((now + service - arrived) * 1000.0)
            last_done = max(last_done, now + service)

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
                events.append((next_eval, count, decision.replicas))
                count, last_out = decision.replicas, next_eval
            elif decision.action == "in":
                gone = count - decision.replicas
                ready -= gone
                slots_free -= gone * concurrency  # may go negative: they finish what they hold
                events.append((next_eval, count, decision.replicas))
                count, last_in = decision.replicas, next_eval
            next_eval += evaluate_every_s
        if arrival is None:
            advance(float("inf"))
            break
        advance(at)
        queue.append((at, service_s(arrival)))
        serve(at)
    end = max(trace.seconds, last_done)
    removed = sum(max(0, before - after) for t, before, after in events if t < end)
    held = replica_seconds(start, events, end) + removed * drain_s
    return ModelRun(latencies, held, end, events)


def replica_seconds(start: int, events: Sequence[tuple[float, int, int]], end: float) -> float:
    """The integral of the replica count over ``[0, end]``: ``start`` until the first event,
    each event's ``to`` from its time on (events at or after ``end`` do not count)."""
    total, at, count = 0.0, 0.0, start
    for t, _, to in events:
        if t >= end:
            break
        total += count * (t - at)
        at, count = t, to
    return total + count * (end - at)


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
    peak = run_model(trace, concurrency=concurrency, start=static_peak)
    slo = 2.0 * (percentile(peak.latencies_ms, 99) or 0.0)
    rows = []
    for lag in lags:
        run = run_model(
            trace,
            concurrency=concurrency,
            start=start,
            limits=limits,
            lag_s=lag,
            evaluate_every_s=evaluate_every_s,
        )
        latencies = run.latencies_ms
        within = sum(1 for ms in latencies if ms <= slo) / max(1, len(latencies))
        saving = 1.0 - run.replica_seconds / peak.replica_seconds if peak.replica_seconds else 0.0
        rows.append(
            {
                "lag_s": lag,
                "within_slo_percent": round(100.0 * within, 2),
                "saving_vs_static_peak_percent": round(100.0 * saving, 1),
            }
        )
    ok = [r["lag_s"] for r in rows if r["within_slo_percent"] >= 99.0]
    most = max(ok, default=None)
    return {
        "model_slo_ms": round(slo, 1),
        "lags": rows,
        "tolerated_lag_s": most,
        "tolerated_lag_trace_s": None if most is None else round(most * trace.factor, 1),
    }
