"""The last hour of a deployment's autoscaling, for its page's chart: the replica count against the
metric and the target.

Each evaluation (:func:`fleet.autoscaling.services.autoscale_evaluate`) appends a point (time,
replicas, ready, the metric per ready replica, the count the rule wanted) to a short list in the
cache (Redis in production), at most :data:`KEEP_POINTS` of them over :data:`WINDOW_S`; the
rule's scale-in stabilization reads the counts wanted back (:func:`recent_desired`). The cache is
a hint that can be lost: the decisions that changed the count are operations, with the metric
values that drove them, and the chart draws them too, so a flushed cache still shows every
scaling step (and the stabilization starts again from the readings that follow).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.core.cache import cache

from fleet.core.models import Operation, OperationKind, OperationStatus

logger = logging.getLogger(__name__)

WINDOW_S = 3600.0
KEEP_POINTS = 720
WIDTH = 600
HEIGHT = 80


def _key(deployment_id: int) -> str:
    return f"autoscaling:history:{deployment_id}"


def history_record(
    *,
    deployment_id: int,
    at: float,
    replicas: int,
    ready: int,
    value: float | None,
    desired: int | None = None,
) -> None:
    """Append one evaluation's point; a cache that fails costs the point, not the evaluation."""
    try:
        points: list[list[Any]] = cache.get(_key(deployment_id)) or []
        points = [p for p in points if p[0] >= at - WINDOW_S][-(KEEP_POINTS - 1) :]
        points.append([round(at, 3), replicas, ready, value, desired])
        cache.set(_key(deployment_id), points, timeout=int(WINDOW_S) + 60)
    except Exception:  # the cache is a hint (Redis down, a timeout)
        logger.warning("autoscaling history of %s not recorded", deployment_id, exc_info=True)


def recent_desired(deployment_id: int, since: float) -> int | None:
    """The most replicas the rule wanted at the evaluations since ``since`` (the scale-in
    stabilization of :mod:`fleet.autoscaling.rule`); ``None``: no such point (a cache that lost
    them, or a new policy): the rule then scales in on the reading alone."""
    try:
        points: list[list[Any]] = cache.get(_key(deployment_id)) or []
    except Exception:
        return None
    wanted = [int(p[4]) for p in points if len(p) > 4 and p[4] is not None and p[0] >= since]
    return max(wanted, default=None)


@dataclass(frozen=True)
class Point:
    t: float
    replicas: int
    value: float | None  # the metric per ready replica


def history_of(deployment_id: int, now: float | None = None) -> list[Point]:
    """The evaluations of the last hour and the ``autoscale`` operations, by time."""
    now = time.time() if now is None else now
    since = now - WINDOW_S
    try:
        cached: list[list[Any]] = cache.get(_key(deployment_id)) or []
    except Exception:
        cached = []
    points = [Point(float(p[0]), int(p[1]), p[3]) for p in cached if p[0] >= since]
    operations = Operation.objects.filter(
        deployment_id=deployment_id,
        kind=OperationKind.AUTOSCALE,
        status=OperationStatus.SUCCEEDED,
        created_at__gte=datetime.fromtimestamp(since, UTC),
    ).values_list("created_at", "payload")
    for created_at, payload in operations:
        payload = payload or {}
        if isinstance(payload.get("to"), int):
            t = created_at.timestamp()
            value = payload.get("per_replica")
            value = float(value) if isinstance(value, int | float) else None
            if isinstance(payload.get("from"), int):
                points.append(Point(t - 0.001, payload["from"], value))
            points.append(Point(t, payload["to"], value))
    return sorted(points, key=lambda p: p.t)


@dataclass(frozen=True)
class HistoryChart:
    replicas_path: str  # a step line
    value_path: str
    target_y: float
    replicas_max: int
    value_max: float
    latest_replicas: int | None
    has_data: bool
    minutes: int  # the span drawn, in minutes (an hour at most)


def _x(t: float, t0: float, span: float) -> float:
    return round((t - t0) / span * WIDTH, 1)


def _y(value: float, top: float) -> float:
    return round(HEIGHT - min(value, top) / top * HEIGHT, 1)


def history_chart(
    points: list[Point], *, target: float, most: int, now: float | None = None
) -> HistoryChart:
    """The chart's geometry from the first point (at most an hour before ``now``) to ``now``:
    replicas as steps (scale: the policy's max), the metric as a line broken where it had no
    value, the target as a level."""
    now = time.time() if now is None else now
    t0 = max(now - WINDOW_S, min((p.t for p in points), default=now))
    span = max(now - t0, 60.0)
    values = [p.value for p in points if p.value is not None]
    value_max = max([target * 2.0, *(v * 1.1 for v in values)])
    replicas_max = max([most, *(p.replicas for p in points)], default=most) or 1
    steps: list[str] = []
    for n, point in enumerate(points):
        x, y = _x(point.t, t0, span), _y(point.replicas, replicas_max)
        steps.append(f"M{x},{y}" if n == 0 else f"H{x} V{y}")
    if points:
        steps.append(f"H{WIDTH}")
    segments: list[str] = []
    drawing = False
    for point in points:
        if point.value is None:
            drawing = False
            continue
        x, y = _x(point.t, t0, span), _y(point.value, value_max)
        segments.append(f"{'L' if drawing else 'M'}{x},{y}")
        drawing = True
    return HistoryChart(
        replicas_path=" ".join(steps),
        value_path=" ".join(segments),
        target_y=_y(target, value_max),
        replicas_max=replicas_max,
        value_max=round(value_max, 2),
        latest_replicas=points[-1].replicas if points else None,
        has_data=bool(points),
        minutes=max(1, min(60, round(span / 60.0))),
    )
