"""The usage page: GPU-equivalents each team held over a window (a stacked SVG chart drawn on
the server), the chargeback table of ``GET /api/v1/usage`` and its CSV export."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from fleet.allocations.accounting.usage import GROUPS, Window, timeline, usage_report, usage_window
from fleet.core.roles import Role
from fleet.web.access import role_required
from fleet.web.views import page_context

WIDTH, HEIGHT = 720, 200
WINDOWS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
WINDOW_LABELS = {"24h": "Last 24 hours", "7d": "Last 7 days", "30d": "Last 30 days"}
GROUP_LABELS = {"team": "Team", "deployment": "Deployment", "product": "GPU product"}
# Distinct in dark and light themes; the legend and the table name every band too.
PALETTE = ("#4e8fe0", "#e0883a", "#47a86b", "#c9534f", "#9a6fd1", "#3aa6a6", "#b8a02e", "#d06aa7")


@dataclass(frozen=True)
class Band:
    team: str
    color: str
    path: str
    total_hours: float


def stacked_bands(
    starts: list[datetime], series: dict[str, list[float]], window: Window
) -> tuple[list[Band], float]:
    """One closed path per team, stacked in name order: each bucket a flat step."""
    count = len(starts)
    peak = max((sum(v[i] for v in series.values()) for i in range(count)), default=0.0)
    y_max = max(1.0, peak * 1.1)
    step = WIDTH / max(count, 1)
    base = [0.0] * count
    bands = []
    for n, (team, values) in enumerate(series.items()):
        top = [b + v for b, v in zip(base, values, strict=True)]

        def y(value: float) -> float:
            return round(HEIGHT - value / y_max * HEIGHT, 1)

        upper = " ".join(
            f"L{round(i * step, 1)},{y(top[i])} L{round((i + 1) * step, 1)},{y(top[i])}"
            for i in range(count)
        )
        lower = " ".join(
            f"L{round((i + 1) * step, 1)},{y(base[i])} L{round(i * step, 1)},{y(base[i])}"
            for i in reversed(range(count))
        )
        path = f"M0,{y(base[0]) if count else HEIGHT} {upper} {lower} Z"
        hours = sum(values) * (window.end - window.start).total_seconds() / 3600 / max(count, 1)
        bands.append(Band(team, PALETTE[n % len(PALETTE)], path, round(hours, 2)))
        base = top
    return bands, y_max


@role_required(Role.MEMBER)
def usage(request: HttpRequest) -> HttpResponse:
    """Chargeback over the last 24 h, 7 or 30 days, grouped by team, deployment or product."""
    span = request.GET.get("window", "24h")
    span = span if span in WINDOWS else "24h"
    group_by = request.GET.get("group_by", "team")
    group_by = group_by if group_by in GROUPS else "team"
    now = timezone.now()
    window = usage_window(now - WINDOWS[span], now, group_by, now=now)
    report = usage_report(window)
    starts, series = timeline(window)
    bands, y_max = stacked_bands(starts, series, window)
    query = {"from": window.start.isoformat(), "to": window.end.isoformat(), "group_by": group_by}
    context = {
        **page_context(request, "usage"),
        "report": report,
        "bands": bands,
        "y_max": round(y_max, 2),
        "width": WIDTH,
        "height": HEIGHT,
        "first": starts[0] if starts else window.start,
        "window": window,
        "span": span,
        "group_by": group_by,
        "windows": WINDOW_LABELS,
        "groups": GROUP_LABELS,
        "group_label": GROUP_LABELS[group_by],
        "csv_url": "/api/v1/usage?" + urlencode({**query, "format": "csv"}),
        "json_url": "/api/v1/usage?" + urlencode(query),
    }
    return render(request, "web/usage.html", context)
