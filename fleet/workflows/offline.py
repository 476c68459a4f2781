"""Unreachable is not failed: what becomes of the replicas of hosts whose agent went quiet.

Learned from Kubernetes' node lifecycle controller (and ECS, which also tells a lost agent from a
failed instance). A quiet host is ``offline`` at once
(:func:`fleet.partitioning.delivery.hosts_mark_offline`), but:

- **Grace.** Its replicas keep their places for ``FLEET_EVICT_OFFLINE_AFTER_SECONDS`` (300 s, the
  ``tolerationSeconds`` Kubernetes gives every pod for an unreachable node) from
  ``Host.offline_since``. A host back within the grace keeps everything; nothing was moved.
- **Mass offline.** While more than ``FLEET_MASS_OFFLINE_FRACTION`` (0.55, Kubernetes'
  ``--unhealthy-zone-threshold``) of the enrolled hosts are offline together, the fault is most
  likely ours (an ASGI server, Redis, the network): nothing is evicted. A ``mass_offline``
  operation records when this starts and when it ends; hosts still offline at the end get a full
  grace from then, as Kubernetes restarts its eviction timers when a zone is normal again.
- **Rate.** A host's eviction takes a slot of each GPU product it has, for
  ``FLEET_EVICT_RATE_WINDOW_SECONDS`` (60 s) from its ``evict_host`` operation. A product of
  ``n`` enrolled hosts has ``max(1, FLEET_EVICT_RATE_FRACTION * n)`` slots (20 %), one below 10
  hosts: Kubernetes' per-zone ``--node-eviction-rate``, with GPU products as the zones. So a
  correlated failure just under the mass threshold drains a product in steps, not at once.

GPU faults a live agent reports (Xid, ECC, MPS daemon, lost GPU) are not unreachability: they
move replicas at once (:func:`fleet.workflows.health.gpu_mark_unhealthy`).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, F, OuterRef, Q
from django.utils import timezone

from fleet.allocations.models import Allocation
from fleet.core import alerts
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.inventory.models import Gpu, Host, HostStatus
from fleet.workflows.health import replace_allocations

logger = logging.getLogger(__name__)

# Below this many hosts a product evicts one host per window (Kubernetes: a small zone).
SMALL_PRODUCT_HOSTS = 10


@dataclass(frozen=True)
class OfflineShare:
    """How many of the enrolled hosts (an agent holds their token) are offline now."""

    offline: int
    enrolled: int

    @property
    def mass(self) -> bool:
        """More than ``FLEET_MASS_OFFLINE_FRACTION`` of them: suspect ourselves, not them."""
        fraction = float(settings.FLEET_MASS_OFFLINE_FRACTION)
        return self.enrolled > 0 and self.offline > fraction * self.enrolled


def hosts_offline_share() -> OfflineShare:
    """One query on the hosts table (cheap enough for every dashboard page)."""
    counts = Host.objects.filter(token_hash__gt="").aggregate(
        enrolled=Count("pk"), offline=Count("pk", filter=Q(status=HostStatus.OFFLINE))
    )
    return OfflineShare(offline=counts["offline"], enrolled=counts["enrolled"])


def eviction_slots(hosts: int) -> int:
    """How many hosts of a product of ``hosts`` hosts may be evicted within one window."""
    if hosts < SMALL_PRODUCT_HOSTS:
        return 1
    return max(1, int(hosts * float(settings.FLEET_EVICT_RATE_FRACTION)))


def hosts_evict_offline(now: datetime | None = None) -> list[int]:
    """Re-place the replicas of hosts offline longer than the grace period (beat).

    Nothing moves during a mass offline; otherwise the hosts offline longest go first, as many
    as the rate allows. Returns the ids of the hosts whose replicas were re-placed.
    """
    now = now or timezone.now()
    if mass_offline_guard(now):
        return []
    due = _hosts_due(now)
    if not due:
        return []
    claims = _claim(due, now)
    return [host_id for host_id, claim in claims.items() if _evict_host(host_id, claim)]


def mass_offline_guard(now: datetime) -> bool:
    """Whether most hosts are offline together; records the start and the end of it once."""
    share = hosts_offline_share()
    if share.mass != _mass_offline_recorded():
        _mass_offline_changed(share, now)
    return share.mass


def _mass_offline_recorded() -> bool:
    payload = (
        Operation.objects.filter(kind=OperationKind.MASS_OFFLINE)
        .order_by("-id")
        .values_list("payload", flat=True)
        .first()
    )
    return bool(payload and payload.get("active"))


@transaction.atomic
def _mass_offline_changed(share: OfflineShare, now: datetime) -> None:
    # Compare-and-set on the last record: a racing run waits for this lock, then reads again
    # (a new statement sees the other's record), so each start and end is recorded once.
    last = Operation.objects.filter(kind=OperationKind.MASS_OFFLINE).order_by("-id")
    list(last.select_for_update().values_list("pk", flat=True)[:1])
    if share.mass == _mass_offline_recorded():
        return
    _record_mass_offline(share, active=share.mass)
    if share.mass:
        logger.warning(
            "%s of %s hosts offline together: evictions paused", share.offline, share.enrolled
        )
    else:
        # Meanwhile no one could tell a dead host from our own fault: the hosts still quiet
        # get a whole grace period from now.
        Host.objects.filter(status=HostStatus.OFFLINE, offline_since__isnull=False).update(
            offline_since=now
        )


def _record_mass_offline(share: OfflineShare, *, active: bool) -> None:
    counted = f"{share.offline} of {share.enrolled} hosts offline"
    if active:
        summary = f"Mass offline: {counted} together; evictions paused"
        reason = (
            "More than "
            f"{float(settings.FLEET_MASS_OFFLINE_FRACTION):.0%} of the hosts went quiet together: "
            "the fault is most likely the control plane's (a server, Redis, the network), so no "
            "replica is moved until they return."
        )
    else:
        summary = f"Mass offline over: {counted}; evictions resume"
        reason = "Hosts returned. Those still offline get a full grace period from now."
    alerts.alert_emit(
        event=alerts.HOSTS_MASS_OFFLINE,
        summary=summary,
        subject={"offline": share.offline, "enrolled": share.enrolled},
        resolved=not active,
    )
    operation_record(
        kind=OperationKind.MASS_OFFLINE,
        summary=summary,
        status=OperationStatus.SUCCEEDED,
        reason=reason,
        payload={"active": active, "offline": share.offline, "enrolled": share.enrolled},
    )


def _hosts_due(now: datetime) -> list[int]:
    """Offline past the grace, with replicas still on them; the longest offline first."""
    grace = timedelta(seconds=float(settings.FLEET_EVICT_OFFLINE_AFTER_SECONDS))
    placed = Allocation.objects.placed().filter(gpu__host_id=OuterRef("pk"))
    due = Host.objects.filter(
        Exists(placed), status=HostStatus.OFFLINE, offline_since__lte=now - grace
    )
    return list(due.order_by("offline_since", "pk").values_list("pk", flat=True))


def _claim(due: list[int], now: datetime) -> dict[int, int]:
    """Record an ``evict_host`` operation for each due host the rate allows; returns host id ->
    its operation, including hosts claimed before whose replicas are still there (a crash)."""
    with transaction.atomic():
        # Locking the due hosts serialises overlapping beat runs: the second sees the first's
        # claims, so two runs cannot both take a product's last slot.
        locked = Host.objects.select_for_update().filter(pk__in=due).order_by("pk")
        hosts = {h.pk: h for h in locked}
        claims = dict(
            Operation.objects.filter(
                kind=OperationKind.EVICT_HOST,
                host_id__in=list(hosts),
                created_at__gte=F("host__offline_since"),
            ).values_list("host_id", "pk")
        )
        fresh = [hosts[pk] for pk in due if pk in hosts and pk not in claims]
        for host in _within_rate(fresh, now):
            claims[host.pk] = _record_claim(host, now).pk
    return claims


def _within_rate(fresh: list[Host], now: datetime) -> list[Host]:
    window = timedelta(seconds=float(settings.FLEET_EVICT_RATE_WINDOW_SECONDS))
    recent = set(
        Operation.objects.filter(
            kind=OperationKind.EVICT_HOST, created_at__gte=now - window
        ).values_list("host_id", flat=True)
    )
    products = _products_of({h.pk for h in fresh} | {pk for pk in recent if pk is not None})
    used = Counter(p for pk in recent if pk is not None for p in products.get(pk, {""}))
    sizes = _hosts_per_product()
    chosen = []
    for host in fresh:
        mine = products.get(host.pk, {""})
        if all(used[p] < eviction_slots(sizes.get(p, 0)) for p in mine):
            chosen.append(host)
            used.update(mine)
        else:
            logger.info("offline host %s waits for an eviction slot", host.name)
    return chosen


def _products_of(host_ids: set[int]) -> dict[int, set[str]]:
    products: dict[int, set[str]] = {}
    rows = Gpu.objects.filter(host_id__in=host_ids).values_list("host_id", "product_key")
    for host_id, key in rows.distinct():
        products.setdefault(host_id, set()).add(key)
    return products


def _hosts_per_product() -> dict[str, int]:
    rows = (
        Gpu.objects.filter(host__token_hash__gt="")
        .values("product_key")
        .annotate(hosts=Count("host", distinct=True))
    )
    return {row["product_key"]: row["hosts"] for row in rows}


def _record_claim(host: Host, now: datetime) -> Operation:
    quiet = int((now - host.offline_since).total_seconds()) if host.offline_since else 0
    return operation_record(
        kind=OperationKind.EVICT_HOST,
        summary=f"{host.name} offline for {quiet} s: re-placing its replicas",
        host=host,
        status=OperationStatus.SUCCEEDED,
        reason=(
            f"No agent message for longer than the grace period "
            f"({int(settings.FLEET_EVICT_OFFLINE_AFTER_SECONDS)} s) while most hosts answer."
        ),
        payload={"offline_since": host.offline_since.isoformat() if host.offline_since else None},
    )


def _evict_host(host_id: int, claim: int) -> bool:
    """Move the host's replicas, holding its row: a host back in the meantime keeps them, and a
    second run waits here, then finds nothing left to move."""
    with transaction.atomic():
        host = Host.objects.select_for_update().filter(pk=host_id).first()
        if host is None or host.status != HostStatus.OFFLINE:
            return False
        moved = replace_allocations(
            host_id=host_id, reason=f"host {host.name} is offline past the grace period"
        )
        Operation.objects.filter(pk=claim).update(result={"replace": moved})
    return bool(moved)
