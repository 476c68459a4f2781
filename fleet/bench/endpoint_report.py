"""What ``bench_endpoints`` reports, and its goals.

* ``failed``: requests that got no answer (connection refused, reset, closed, timed out) or a
  5xx/4xx, through the gateway. ``failed_during_changes``: those whose time in flight overlapped
  a move, the rolling update or the host drain. ``failed_on_killed_replica``: those in flight
  when the copy's process was SIGKILLed (sent before, answered after).
* ``latency_ms``: each request's time from send to the whole answer, ``balancer`` (through the
  gateway, during the changes) and ``direct`` (the same arrivals straight to the copies, before).
* ``p99_overhead_ms``: the gateway's cost. Each request's time *outside the copy's handler*
  (its latency minus the handler's own ``X-Service-Ms``: the network, the client, the copy's
  HTTP parsing, and through the gateway HAProxy too) is taken, and the direct run's p99 of it is
  subtracted from the gateway run's, over the gateway run's requests that overlapped no change
  (the balancer's cost, not that of processes starting and stopping beside it on the same CPUs;
  ``p99_overhead_all_ms`` counts every request; ``p50_overhead_ms`` compares the medians, which a
  busy machine's scheduling noise moves far less than the p99s). Subtracting the handler time
  takes out the token-driven service time, which would otherwise drown a millisecond in
  hundreds.
* ``update_lag_ms``: :func:`fleet.bench.gateway_watch.update_lags`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleet.bench.endpoint_changes import GRACEFUL, Change
from fleet.bench.gateway_watch import read_events, update_lags
from fleet.bench.replay import Outcome, Replayer, percentile

GOAL_OVERHEAD_MS = 2.0
GOAL_LAG_MS = 1000.0


def _p(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "p50": _round(percentile(values, 50)),
        "p99": _round(percentile(values, 99)),
        "max": _round(max(values) if values else None),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _outside(outcomes: Sequence[Outcome]) -> list[float]:
    return [o.latency_ms - o.service_ms for o in outcomes if o.ok and o.service_ms is not None]


def _overlaps(outcome: Outcome, change: Change) -> bool:
    return outcome.sent_at <= change.ended and outcome.ended_at >= change.started


def report(
    *,
    direct: Replayer,
    through: Replayer,
    changes: Sequence[Change],
    wanted: Sequence[str],
    events: Path,
    origin: float,
    replay_ended: float,
    setup: dict[str, Any],
) -> dict[str, Any]:
    failed = [o for o in through.outcomes if not o.ok]
    by_change: dict[str, int] = {}
    for change in changes:
        by_change[change.kind] = sum(1 for o in failed if _overlaps(o, change))
    during = [o for o in failed if any(_overlaps(o, c) for c in changes if c.kind in GRACEFUL)]
    kills = [float(c.detail["killed_at"]) for c in changes if "killed_at" in c.detail]
    on_killed = [o for o in failed if any(o.sent_at <= k <= o.ended_at for k in kills)]
    lags, missed = update_lags(read_events(events))
    steady = [o for o in through.outcomes if not any(_overlaps(o, c) for c in changes)]
    outside_b, outside_d = _outside(through.outcomes), _outside(direct.outcomes)
    outside_s = _outside(steady)
    overhead = _minus(percentile(outside_s, 99), percentile(outside_d, 99))
    lag = _p(lags)
    result: dict[str, Any] = {
        "requests": len(through.outcomes),
        "succeeded": len(through.outcomes) - len(failed),
        "failed": len(failed),
        "failed_during_changes": len(during),
        "failed_on_killed_replica": len(on_killed),
        "failed_by_change": by_change,
        "failed_outside_changes": sum(
            1 for o in failed if not any(_overlaps(o, c) for c in changes)
        ),
        "failure_examples": sorted({o.error or f"HTTP {o.status}" for o in failed})[:5],
        "failed_at_s": [round(o.sent_at - origin, 2) for o in failed][:20],
        "p99_overhead_ms": overhead,
        "p99_overhead_all_ms": _minus(percentile(outside_b, 99), percentile(outside_d, 99)),
        "p50_overhead_ms": _minus(percentile(outside_s, 50), percentile(outside_d, 50)),
        "update_lag_ms": {**lag, "count": len(lags), "not_followed": missed},
        "latency_ms": {"balancer": _p(_ok(through)), "direct": _p(_ok(direct))},
        "outside_handler_ms": {
            "balancer": _p(outside_b),
            "balancer_steady": {**_p(outside_s), "requests": len(outside_s)},
            "direct": _p(outside_d),
        },
        "direct_failed": sum(1 for o in direct.outcomes if not o.ok),
        "client": {
            "late_ms_p99": {
                "balancer": _round(percentile(through.late_ms, 99)),
                "direct": _round(percentile(direct.late_ms, 99)),
            },
            "stale_connection_retries": through.stale_retries + direct.stale_retries,
        },
        "changes": [c.report(origin) for c in changes],
        "replay_s": round(replay_ended - origin, 2),
        "setup": setup,
    }
    done = {c.kind for c in changes if c.ok and c.ended <= replay_ended}
    goals = {
        "every change done within the replay": all(k in done for k in wanted),
        "0 failed during moves, rollout and drain": len(during) == 0,
        "only requests in flight on the killed replica failed": len(failed) == len(on_killed),
        f"p99 overhead under {GOAL_OVERHEAD_MS:g} ms": overhead is not None
        and overhead < GOAL_OVERHEAD_MS,
        f"update lag p99 under {GOAL_LAG_MS:g} ms": lag["p99"] is not None
        and lag["p99"] < GOAL_LAG_MS,
    }
    result["goals"] = goals
    result["goal_met"] = all(goals.values())
    return result


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def _ok(replayer: Replayer) -> list[float]:
    return [o.latency_ms for o in replayer.outcomes if o.ok]
