"""An endpoint's traffic over time: a point per :data:`POINT_S` seconds and gateway, kept an
hour (:data:`fleet.endpoints.history.KEEP`), for ``GET /deployments/{id}/traffic?window=`` and
the deployment page's charts. Written with the readings (:func:`history_record`, one upsert per
gateway tick whatever the number of endpoints), read summed over the gateways
(:func:`deployment_history`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from fleet.endpoints.models import Traffic, TrafficPoint

POINT_S = 10
KEEP = timedelta(hours=1)
WINDOWS_S: dict[str, int] = {"5m": 300, "15m": 900, "1h": 3600}
# The bucket each gateway (in this process) last dropped the points past KEEP in.
_purged: dict[str, datetime] = {}
_FIELDS = [
    "requests_per_s",
    "errors_per_s",
    "in_flight",
    "queued",
    "response_ms",
    "ready_replicas",
]


@dataclass(frozen=True)
class HistoryPoint:
    ts: datetime
    requests_per_s: float | None
    errors_per_s: float | None
    in_flight: int
    queued: int
    response_ms: float | None  # weighted by the gateways' request rates
    ready_replicas: int  # copies in rotation, the largest any gateway saw


def bucket_of(now: datetime) -> datetime:
    seconds = int(now.timestamp()) // POINT_S * POINT_S
    return datetime.fromtimestamp(seconds, tz=now.tzinfo)


def _point(gateway: str, deployment_id: int, ts: datetime, rows: list[Traffic]) -> TrafficPoint:
    backend = [r for r in rows if r.allocation_id == 0]
    copies = [r for r in rows if r.allocation_id]
    weighted = [(r.response_ms, r.requests_per_s or 0.0) for r in copies if r.response_ms]
    total = sum(w for _, w in weighted)
    source = backend or copies
    rates = [r.requests_per_s for r in source if r.requests_per_s is not None]
    errors = [r.errors_per_s for r in backend if r.errors_per_s is not None]
    return TrafficPoint(
        gateway=gateway,
        deployment_id=deployment_id,
        ts=ts,
        requests_per_s=round(sum(rates), 3) if rates else None,
        errors_per_s=round(sum(errors), 3) if errors else None,
        in_flight=sum(r.in_flight for r in source),
        queued=sum(r.queued for r in rows),
        response_ms=round(sum(ms * w for ms, w in weighted) / total, 1) if total else None,
        ready_replicas=sum(1 for r in copies if r.state == "ready"),
    )


def history_record(gateway: str, rows: Iterable[Traffic], now: datetime) -> None:
    """This tick's readings of one gateway as this bucket's points (the last tick of a bucket
    wins), and, once a bucket, the points past :data:`KEEP` gone. One query a tick."""
    by_deployment: dict[int, list[Traffic]] = defaultdict(list)
    for row in rows:
        by_deployment[row.deployment_id].append(row)
    ts = bucket_of(now)
    points = [_point(gateway, pk, ts, group) for pk, group in by_deployment.items()]
    TrafficPoint.objects.bulk_create(
        points,
        update_conflicts=True,
        unique_fields=["gateway", "deployment_id", "ts"],
        update_fields=_FIELDS,
    )
    if _purged.get(gateway) != ts:  # once per bucket, not at every tick
        TrafficPoint.objects.filter(ts__lt=now - KEEP).delete()
        _purged[gateway] = ts


def deployment_history(
    deployment_id: int, *, window_s: int, now: datetime | None = None
) -> list[HistoryPoint]:
    """The deployment's points over the last ``window_s`` seconds, oldest first, the gateways
    summed (one query: at most 360 points an hour per gateway)."""
    now = now or timezone.now()
    since = now - timedelta(seconds=window_s)
    buckets: dict[datetime, list[TrafficPoint]] = defaultdict(list)
    for point in TrafficPoint.objects.filter(deployment_id=deployment_id, ts__gte=since):
        buckets[point.ts].append(point)
    return [_summed(ts, buckets[ts]) for ts in sorted(buckets)]


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known), 3) if known else None


def _summed(ts: datetime, points: list[TrafficPoint]) -> HistoryPoint:
    weighted = [(p.response_ms, p.requests_per_s or 0.0) for p in points if p.response_ms]
    total = sum(w for _, w in weighted)
    if total:
        response: float | None = round(sum(ms * w for ms, w in weighted) / total, 1)
    else:
        response = weighted[0][0] if weighted else None
    return HistoryPoint(
        ts=ts,
        requests_per_s=_sum(p.requests_per_s for p in points),
        errors_per_s=_sum(p.errors_per_s for p in points),
        in_flight=sum(p.in_flight for p in points),
        queued=sum(p.queued for p in points),
        response_ms=response,
        ready_replicas=max(p.ready_replicas for p in points),
    )
