"""The bench's knobs and the figures' shape: what the bench deploys, how often it polls, and
percentiles in milliseconds."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SLICES_PER_GPU = 7
MAX_MOVES = 20
POLL_S = 0.05
HOST = "bench-runtime"
# Exits at once on SIGTERM (a shell as PID 1 ignores it otherwise, and the stop would last the
# whole grace): the figure is the agent's work, not a grace period.
COMMAND = ["sh", "-c", "trap 'exit 0' TERM; sleep 86400 & wait"]


@dataclass
class RuntimeOptions:
    replicas: int = 20
    runtime: str = "docker"
    image: str = "fleet-test/busybox:2"
    database_url: str = ""
    workdir: Path | None = None
    timeout_s: float = 120.0
    log: Any = print


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]

    return {
        "p50": round(statistics.median(ordered) * 1000, 1),
        "p99": round(at(0.99) * 1000, 1),
        "max": round(ordered[-1] * 1000, 1),
    }
