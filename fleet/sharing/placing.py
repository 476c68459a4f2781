"""Placing from the queue: the waiting replicas of deployments the engine places
(``auto_place``: created with ``auto``, or scaled by their autoscaling policy) are placed as
capacity frees, in the order the queue serves them (:func:`fleet.placement.fairshare.queue_order`:
priority, then the team's weighted share of decayed use, then the longest waiting). Beat runs it
(``fleet.place_queue``) every ``FLEET_QUEUE_PLACE_EVERY_S`` (5 s).

Each replica goes through :func:`fleet.allocations.autoplace.deployment_autoplace` (one replica,
its own transaction): the team's quota and limit, borrowing only what no other team's deserved
share needs, the engine's best target; nothing is forced. Within a run, a replica that fits
nowhere stops the attempts at every other replica asking for the same (the fleet only fills up
during a run), and a replica its team's quota (or borrowing) refuses stops those of its team
asking for at least as much (:func:`fleet.placement.quota.covers`: a smaller one may still be
let in, as what-would-it-take's ``place`` plan says); at most :data:`MAX_ATTEMPTS` attempts a
run. Runs are serialised (a PostgreSQL advisory lock; SQLite serialises writers), so two workers
never place the head of the queue twice. Replicas of deployments that operators place wait for
them: the queue shows where they stand.
"""

from __future__ import annotations

from django.db import connection, transaction

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.quotas import QuotaExceeded
from fleet.allocations.selectors import placement_demand, placement_request
from fleet.core.errors import ServiceError
from fleet.core.jobs import reclaim_after_commit
from fleet.placement.fairshare import queue_order
from fleet.placement.quota import Usage, covers, replica_demand
from fleet.sharing.queue import current_shares, waiting_replicas

ADVISORY_KEY = 0x5EC1A2
"""The advisory lock that serialises runs (PostgreSQL)."""
MAX_ATTEMPTS = 20
"""Placement attempts one run makes at most (each ranks the fleet)."""


def queue_place() -> list[int]:
    """Place waiting replicas of ``auto_place`` deployments that fit now, in queue order;
    returns the ``place`` operations recorded."""
    return queue_place_unless_busy() or []


def queue_place_unless_busy() -> list[int] | None:
    """:func:`queue_place`, or ``None`` where another worker's run holds the queue now (this
    one placed nothing: what it would have placed is that run's, or the next one's)."""
    waiting, deployments = waiting_replicas()
    auto = [w for w in waiting if deployments[w.deployment_id].auto_place]
    if not auto:
        return []
    placed: list[int] = []
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_KEY])
                if not cursor.fetchone()[0]:
                    return None  # another worker is placing from the queue now
        attempts = 0
        full: set[str] = set()  # requests that fit nowhere in this run
        refused: dict[int, list[Usage]] = {}  # per team, the demands its quota refused
        for queued in queue_order(auto, current_shares()):
            deployment = deployments[queued.waiting.deployment_id]
            demand = replica_demand(placement_request(deployment))
            if any(covers(demand, r) for r in refused.get(deployment.team_id, ())):
                continue
            asks = repr((placement_request(deployment), placement_demand(deployment)))
            if asks in full:
                continue
            if attempts >= MAX_ATTEMPTS:
                break
            attempts += 1
            try:
                with transaction.atomic():
                    operations = deployment_autoplace(deployment_id=deployment.pk, limit=1)
            except QuotaExceeded:
                refused.setdefault(deployment.team_id, []).append(demand)
                continue
            except ServiceError:  # no capacity, or borrowing what another team needs
                full.add(asks)
                continue
            placed.extend(op.pk for op in operations)
        if full:
            reclaim_after_commit()  # some wait for capacity: reclaim for those entitled now
    return placed
