"""``bench_autoscale``'s figures per mode, the SLO and the goals.

* **SLO**: twice the p99 latency of ``static_peak`` (the issue's definition); ``over_slo``
  counts the requests slower than it, failed ones included;
* **replica_seconds** and **gpu_equivalent_hours**: the usage module's own measure
  (:mod:`fleet.allocations.accounting.usage`, ``GET /api/v1/usage``) over the replay's window:
  a replica counts from its creation to its deletion, starting and draining included. The
  GPU-equivalent hours are also given in trace time (``x compression``);
* **scale_events**: the ``autoscale`` operations that changed the count during the replay;
* **scale_out_lag_s**: from each scale-out operation to the replay's sampler seeing that many
  replicas ready (the sampler polls every second: up to 1 s more).

Goals (issue 24): autoscaling uses at least 35 % fewer replica-seconds than static peak, keeps
at least 99 % of requests within the SLO with 0 failed; static median misses the SLO (more than
1 % over it) on the code trace.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fleet.bench.replay import Replayer, percentile

SAVING_GOAL = 0.35
WITHIN_SLO_GOAL = 0.99


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _lags(
    operations: list[dict[str, Any]], started_at: datetime, origin: float, samples: list[Any]
) -> list[float]:
    lags = []
    for op in operations:
        payload = op.get("payload") or {}
        if op.get("status") != "succeeded" or payload.get("to", 0) <= payload.get("from", 0):
            continue
        at = origin + (_parse(op["created_at"]) - started_at).total_seconds()
        ready_at = next((t for t, _, ready in samples if t >= at and ready >= payload["to"]), None)
        if ready_at is not None:
            lags.append(round(ready_at - at, 2))
    return lags


def mode_result(
    *,
    replayer: Replayer,
    origin: float,
    started_at: datetime,
    usage: dict[str, Any] | None,
    operations: list[dict[str, Any]],
    samples: list[tuple[float, int, int]],
    initial: int,
) -> dict[str, Any]:
    outcomes = replayer.outcomes
    latencies = [o.latency_ms for o in outcomes]
    within = [
        op
        for op in operations
        if op.get("status") == "succeeded" and _parse(op["created_at"]) >= started_at
    ]
    events = sorted(
        (
            round((_parse(op["created_at"]) - started_at).total_seconds(), 2),
            (op.get("payload") or {}).get("from"),
            (op.get("payload") or {}).get("to"),
            (op.get("payload") or {}).get("per_replica"),
        )
        for op in within
    )
    lags = _lags(within, started_at, origin, samples)
    gpu_hours = float(usage["gpu_hours"]) if usage else 0.0
    return {
        "requests": len(outcomes),
        "failed": sum(1 for o in outcomes if not o.ok),
        "errors": sorted({f"{o.status} {o.error}".strip() for o in outcomes if not o.ok})[:5],
        "failed_at_s": sorted({int(o.sent_at - origin) for o in outcomes if not o.ok})[:40],
        "p50_ms": _round(percentile(latencies, 50)),
        "p99_ms": _round(percentile(latencies, 99)),
        "max_ms": _round(max(latencies, default=None)),
        "replica_seconds": round(gpu_hours * 3600.0, 1),
        "gpu_equivalent_hours": float(usage["gpu_equivalent_hours"]) if usage else 0.0,
        "initial_replicas": initial,
        "mean_replicas": _round(sum(s[1] for s in samples) / len(samples) if samples else None, 2),
        "most_replicas": max((s[1] for s in samples), default=initial),
        "scale_events": len(events),
        "scale_out_lag_s": {
            "p50": percentile(lags, 50),
            "max": max(lags, default=None),
            "count": len(lags),
        },
        "events": [
            {"at_s": at, "from": a, "to": b, "per_replica": _round(v, 2)} for at, a, b, v in events
        ],
        "late_ms_p99": _round(percentile(replayer.late_ms, 99)),
        "_latencies": latencies,
        "_failed": [not o.ok for o in outcomes],
    }


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def report(
    modes: dict[str, dict[str, Any]], *, setup: dict[str, Any], lag_model: dict[str, Any]
) -> dict[str, Any]:
    compression = float(setup["compression"])
    peak = modes.get("static_peak")
    slo = 2.0 * peak["p99_ms"] if peak and peak["p99_ms"] is not None else None
    for result in modes.values():
        latencies, failed = result.pop("_latencies"), result.pop("_failed")
        over = (
            sum(1 for ms, bad in zip(latencies, failed, strict=True) if bad or ms > slo)
            if slo is not None
            else None
        )
        result["over_slo"] = over
        result["over_slo_percent"] = (
            None if over is None or not latencies else round(100.0 * over / len(latencies), 2)
        )
        result["gpu_equivalent_hours_trace_time"] = round(
            result["gpu_equivalent_hours"] * compression, 4
        )
    goals: dict[str, bool | None] = {}
    auto, median = modes.get("autoscale"), modes.get("static_median")
    saving = None
    if auto and peak and peak["replica_seconds"]:
        saving = round(1.0 - auto["replica_seconds"] / peak["replica_seconds"], 3)
        goals["autoscale_saves_35_percent"] = saving >= SAVING_GOAL
    if auto and auto["over_slo"] is not None:
        goals["autoscale_within_slo_99_percent"] = (
            auto["over_slo"] <= (1.0 - WITHIN_SLO_GOAL) * auto["requests"]
        )
        goals["autoscale_0_failed"] = auto["failed"] == 0
    if median and median["over_slo"] is not None and setup.get("trace") == "code":
        goals["static_median_misses_slo"] = (
            median["over_slo"] > (1.0 - WITHIN_SLO_GOAL) * median["requests"]
        )
    return {
        "setup": setup,
        "slo_ms": _round(slo),
        "saving_vs_static_peak": saving,
        **modes,
        "scale_out_lag_tolerated": lag_model,
        "goals": goals,
        "goal_met": bool(goals) and all(goals.values()),
    }
