"""What ``bench_live`` counts as success: the checks of each goal, and what its figures mean."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleet.bench.browsers import DROP_AFTER_S, Browser

DEFINITIONS = {
    "latency_ms": "browser receipt time - sample ts (agent clock, same machine)",
    "dropped": (
        f"sent samples whose GPU showed neither them nor a newer sample in the browser "
        f"within {DROP_AFTER_S:.0f} s of their ts (summed over browsers)"
    ),
    "server_cpu_percent": "CPU of the ASGI server processes, percent of one core",
    "efficiency": "GPU samples delivered to a browser per second of ASGI server CPU",
    "update_gap_s": "longest wait per GPU (and browser) for a new sample in the window",
}


def goals(result: dict[str, Any], goal: str) -> dict[str, bool]:
    """Each check of the chosen goal, passed or not."""
    if goal == "storm":
        recovered = result.get("restart", {}).get("recovery", {})
        return {
            "99% of hosts back within 30 s": _le(recovered.get("p99_s"), 30),
            "all hosts back within 60 s": _le(recovered.get("all_s"), 60),
            "no replica moved": result["replicas_moved"] == 0,
            "no agent closed as abusive": result["abusive_closes"] == 0,
        }
    if goal == "overload":
        offline = result["hosts_offline"] or {}
        return {
            "every agent admitted within 60 s": _le(result["admitted"]["all_s"], 60),
            "no host offline": offline.get("ever", 1) == 0,
            "every GPU updated at least every 5 s": _le(result["update_gap_s"]["max"], 5.0),
            "the fleet view says telemetry is degraded": any(
                int(level) > 0 for level in result["load_frames"]
            ),
            "no agent closed as abusive": result["abusive_closes"] == 0,
        }
    p99 = result["latency_ms"]["p99"]
    return {
        "nothing dropped": result["dropped"] == 0,
        "p99 under 1 s": p99 is not None and p99 < 1000,
    }


def _le(value: float | None, limit: float) -> bool:
    return value is not None and value <= limit


def load_frames(browsers: Sequence[Browser]) -> dict[str, int]:
    out: dict[str, int] = {}
    for browser in browsers:
        for level, n in browser.load_frames.items():
            out[str(level)] = out.get(str(level), 0) + n
    return dict(sorted(out.items()))
