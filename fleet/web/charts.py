"""Server-drawn SVG line charts of a GPU's last hour (the page works before any script runs;
``static/web/detail.js`` redraws the same geometry live). Pure: values in, path strings out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WIDTH = 600
HEIGHT = 120


@dataclass(frozen=True)
class ChartSpec:
    key: str
    title: str
    unit: str
    y_max: float


@dataclass(frozen=True)
class Chart:
    spec: ChartSpec
    line: str
    area: str
    latest: float | None
    has_data: bool
    y_max: float


def downsample(
    points: Sequence[dict[str, float | None]], *, bucket_s: float
) -> list[dict[str, float | None]]:
    """Means per ``bucket_s`` seconds; a metric with no value in a bucket stays ``None``."""
    buckets: dict[int, list[dict[str, float | None]]] = {}
    for point in points:
        t = point["t"]
        if t is None:
            continue
        buckets.setdefault(int(t // bucket_s), []).append(point)
    result: list[dict[str, float | None]] = []
    for index in sorted(buckets):
        rows = buckets[index]
        merged: dict[str, float | None] = {"t": (index + 0.5) * bucket_s}
        for key in rows[0]:
            if key == "t":
                continue
            values = [r[key] for r in rows if r.get(key) is not None]
            merged[key] = (
                round(sum(v for v in values if v is not None) / len(values), 2) if values else None
            )
        result.append(merged)
    return result


def line_chart(
    points: Sequence[dict[str, float | None]], spec: ChartSpec, *, t0: float, t1: float
) -> Chart:
    """The SVG path of one metric over ``[t0, t1]``; a missing value breaks the line."""
    values = [p.get(spec.key) for p in points]
    present = [v for v in values if v is not None]
    y_max = max([spec.y_max, *(v * 1.1 for v in present)]) if present else spec.y_max
    span = max(t1 - t0, 1.0)
    segments: list[list[tuple[float, float]]] = [[]]
    for point, value in zip(points, values, strict=True):
        t = point.get("t")
        if value is None or t is None:
            if segments[-1]:
                segments.append([])
            continue
        x = (t - t0) / span * WIDTH
        y = HEIGHT - min(value, y_max) / y_max * HEIGHT
        segments[-1].append((round(x, 1), round(y, 1)))
    segments = [s for s in segments if s]
    line = " ".join("M" + " L".join(f"{x},{y}" for x, y in seg) for seg in segments)
    area = " ".join(
        f"M{seg[0][0]},{HEIGHT} L"
        + " L".join(f"{x},{y}" for x, y in seg)
        + f" L{seg[-1][0]},{HEIGHT} Z"
        for seg in segments
    )
    latest = next((v for v in reversed(values) if v is not None), None)
    return Chart(
        spec=spec, line=line, area=area, latest=latest, has_data=bool(present), y_max=y_max
    )
