"""The endpoints' traffic as the gateways measure it: recorded every second by each gateway
(:func:`traffic_record`), read per deployment and per copy (:func:`deployment_traffic`,
:func:`replica_traffic`). Several gateways add up: each sees the requests sent through it.

A reading older than :data:`FRESH_S` no longer counts (a gateway that stopped), so the traffic
of an endpoint nobody measures is ``None``, not a stale number.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleet.endpoints.history import KEEP, history_record
from fleet.endpoints.metering import Sample
from fleet.endpoints.models import Endpoint, Traffic

FRESH_S = 10.0
_FIELDS = ["state", "requests_per_s", "errors_per_s", "in_flight", "queued", "response_ms"]


def traffic_record(gateway: str, samples: Sequence[Sample], now: datetime | None = None) -> int:
    """Replace ``gateway``'s readings with ``samples`` (those of slots no endpoint holds are
    dropped); the number of rows written. Three queries, whatever the number of copies."""
    now = now or timezone.now()
    gateway = gateway[:64]
    slots = {s.slot for s in samples}
    deployment_of = dict(
        Endpoint.objects.filter(slot__in=slots).values_list("slot", "deployment_id")
    )
    rows = [
        Traffic(
            gateway=gateway,
            deployment_id=deployment_of[s.slot],
            allocation_id=s.allocation_id,
            state=s.state,
            requests_per_s=s.requests_per_s,
            errors_per_s=s.errors_per_s,
            in_flight=max(0, s.in_flight),
            queued=max(0, s.queued),
            response_ms=s.response_ms,
            updated_at=now,
        )
        for s in samples
        if s.slot in deployment_of
    ]
    with transaction.atomic():
        Traffic.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["gateway", "deployment_id", "allocation_id"],
            update_fields=[*_FIELDS, "updated_at"],
        )
        # This gateway's copies that are gone, and what gateways that stopped left behind.
        Traffic.objects.filter(
            Q(gateway=gateway, updated_at__lt=now) | Q(updated_at__lt=now - KEEP)
        ).delete()
        history_record(gateway, rows, now)
    return len(rows)


@dataclass(frozen=True)
class ReplicaTraffic:
    allocation_id: int
    state: str  # the balancer's word: ready, draining, down, maint (the worst of the gateways)
    requests_per_s: float | None
    errors_per_s: float | None
    in_flight: int
    response_ms: float | None


@dataclass(frozen=True)
class DeploymentTraffic:
    requests_per_s: float | None
    errors_per_s: float | None
    in_flight: int  # the endpoint's requests in progress (its backends': HAProxy's scur)
    queued: int  # waiting for a copy
    response_ms: float | None  # the copies' average, weighted by their request rates
    gateways: int
    updated_at: datetime
    replicas: dict[int, ReplicaTraffic] = field(default_factory=dict)


_WORST = {"maint": 3, "down": 2, "draining": 1, "ready": 0}


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known), 3) if known else None


def _replica(allocation_id: int, rows: list[Traffic]) -> ReplicaTraffic:
    weighted = [(r.response_ms, r.requests_per_s or 0.0) for r in rows if r.response_ms is not None]
    total = sum(w for _, w in weighted)
    response = (
        sum(ms * w for ms, w in weighted) / total
        if total
        else (weighted[0][0] if weighted else None)
    )
    return ReplicaTraffic(
        allocation_id=allocation_id,
        state=max((r.state for r in rows), key=lambda s: _WORST.get(s, 0)),
        requests_per_s=_sum(r.requests_per_s for r in rows),
        errors_per_s=_sum(r.errors_per_s for r in rows),
        in_flight=sum(r.in_flight for r in rows),
        response_ms=None if response is None else round(response, 1),
    )


def traffic_of(deployment_ids: Iterable[int]) -> dict[int, DeploymentTraffic]:
    """The fresh traffic of each deployment that has some, in one query."""
    since = timezone.now() - timedelta(seconds=FRESH_S)
    by_deployment: dict[int, list[Traffic]] = defaultdict(list)
    for row in Traffic.objects.filter(
        deployment_id__in=list(deployment_ids), updated_at__gte=since
    ):
        by_deployment[row.deployment_id].append(row)
    found = {}
    for deployment_id, rows in by_deployment.items():
        backend = [r for r in rows if r.allocation_id == 0]
        copies: dict[int, list[Traffic]] = defaultdict(list)
        for row in rows:
            if row.allocation_id:
                copies[row.allocation_id].append(row)
        replicas = {pk: _replica(pk, group) for pk, group in sorted(copies.items())}
        weighted = [
            (r.response_ms, r.requests_per_s or 0.0)
            for r in replicas.values()
            if r.response_ms is not None
        ]
        total = sum(w for _, w in weighted)
        found[deployment_id] = DeploymentTraffic(
            requests_per_s=_sum(r.requests_per_s for r in backend)
            if backend
            else _sum(r.requests_per_s for r in replicas.values()),
            errors_per_s=_sum(r.errors_per_s for r in backend),
            in_flight=sum(r.in_flight for r in backend)
            if backend
            else sum(r.in_flight for r in replicas.values()),
            queued=sum(r.queued for r in rows),
            response_ms=round(sum(ms * w for ms, w in weighted) / total, 1) if total else None,
            gateways=len({r.gateway for r in rows}),
            updated_at=max(r.updated_at for r in rows),
            replicas=replicas,
        )
    return found


def deployment_traffic(deployment_id: int) -> DeploymentTraffic | None:
    return traffic_of([deployment_id]).get(deployment_id)
