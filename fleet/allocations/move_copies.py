"""The two copies of a moving replica (:mod:`fleet.allocations.moves`): which allocations each
holds, and the three ways a move ends for them: switched (the old copy released, the new one
the replica), promoted (the old copy gone already) or rolled back (the new copy released)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from fleet.allocations.models import Allocation, AllocationState
from fleet.allocations.workloads import allocations_release
from fleet.core.events import publish_changed
from fleet.inventory.models import Host
from fleet.partitioning.desired import host_bump_generation, schedule_push


def copy_of(allocation: Allocation) -> list[Allocation]:
    """Every allocation of the replica copy ``allocation`` belongs to, in slot order (one but
    for a replica of several GPUs); just itself when it is not a placed, settled copy (being
    released, or a move's new copy), which a move refuses."""
    if allocation.state == AllocationState.RELEASING or allocation.replaces_id is not None:
        return [allocation]
    return list(
        Allocation.objects.placed()
        .filter(
            deployment_id=allocation.deployment_id,
            replica=allocation.replica,
            replaces__isnull=True,
        )
        .select_related("partition", "gpu__host", "deployment")
        .order_by("gpu_slot", "pk")
    ) or [allocation]


def copy_ids(payload: dict[str, Any], side: str) -> list[int]:
    """The allocations of a move's old (``from``) or new (``to``) copy, in slot order."""
    many = payload.get(f"{side}_allocations")
    if isinstance(many, list) and many:
        return [int(pk) for pk in many]
    return [int(payload[f"{side}_allocation"])]


def copy_rows(ids: list[int]) -> list[Allocation]:
    return list(
        Allocation.objects.select_related("gpu__host", "deployment")
        .filter(pk__in=ids)
        .order_by("gpu_slot", "pk")
    )


def copy_switch(olds: list[Allocation], news: list[Allocation]) -> None:
    """Release the old copy (its workload stops first) and make the new one the replica."""
    host_id = olds[0].gpu.host_id  # a replica's GPUs are on one host
    Host.objects.select_for_update().get(pk=host_id)
    # Out of the replica's place first: deleting it would point the new copy at nothing while
    # the old row still stands, two copies of one replica.
    Allocation.objects.filter(pk__in=[a.pk for a in olds]).update(state=AllocationState.RELEASING)
    allocations_release(olds)
    host_bump_generation(host_id)
    schedule_push(host_id)
    copy_promote(news)
    publish_changed("gpu", [a.gpu_id for a in (*olds, *news)])


def copy_promote(news: list[Allocation]) -> None:
    Allocation.objects.filter(pk__in=[a.pk for a in news]).update(
        replaces=None, updated_at=timezone.now()
    )
    publish_changed("allocation", [a.pk for a in news])
    publish_changed("deployment", sorted({a.deployment_id for a in news}))


def copy_rollback(news: list[Allocation]) -> None:
    """Release the target: the new copy stops, the old copy was never touched."""
    if not news:
        return
    host_id = news[0].gpu.host_id
    Host.objects.select_for_update().get(pk=host_id)
    allocations_release(news)
    host_bump_generation(host_id)
    schedule_push(host_id)
    publish_changed("gpu", [a.gpu_id for a in news])
    publish_changed("deployment", sorted({a.deployment_id for a in news}))
