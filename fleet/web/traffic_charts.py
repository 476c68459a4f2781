"""The deployment page's endpoint charts: its request rate and response time over the last
15 minutes, from the gateways' points (:mod:`fleet.endpoints.history`), drawn by the server as
the GPU page's charts are (:mod:`fleet.web.charts`)."""

from __future__ import annotations

import time
from typing import Any

from fleet.endpoints.history import POINT_S, deployment_history
from fleet.web import charts

WINDOW_S = 900
SPECS = (
    charts.ChartSpec("requests_per_s", "Requests", "req/s", 1.0),
    charts.ChartSpec("response_ms", "Response time", "ms", 10.0),
)
NO_POINTS = "No gateway measured this endpoint in the last 15 minutes"


def traffic_charts(deployment_id: int, now: float | None = None) -> dict[str, Any]:
    """``{"charts": [(Chart, missing sentence)], "point_s": ...}`` for the template."""
    now = time.time() if now is None else now
    history = deployment_history(deployment_id, window_s=WINDOW_S)
    points: list[dict[str, float | None]] = [
        {
            "t": p.ts.timestamp() + POINT_S / 2,
            "requests_per_s": p.requests_per_s,
            "response_ms": p.response_ms,
        }
        for p in history
    ]
    t0 = now - WINDOW_S
    drawn = [
        (
            charts.line_chart(points, spec, t0=t0, t1=now),
            NO_POINTS if not points else f"No {spec.title.lower()} in the last 15 minutes",
        )
        for spec in SPECS
    ]
    return {"charts": drawn, "point_s": POINT_S}
