"""Borrowing: may a team past its deserved share place one more replica, and is it borrowed?

The rule is :func:`fleet.placement.sharing.sharing_verdict`; this module reads what it weighs:
the team's holdings (:mod:`fleet.allocations.holdings`), the fleet's free capacity in bulk
(whole GPUs, MIG compute slices, MPS memory on schedulable GPUs), and what the other teams'
deserved shares need now (their waiting replicas, each team's up to what its share has left).

The team's own limit is race-safe: the caller holds the team's row lock
(:func:`fleet.allocations.quotas.quota_check`), so two places of one team never both pass it.
What the other teams need is read without their locks: a hint for lending, never a guarantee
(the reclaim takes a deserved share back).
"""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, Sum

from fleet.allocations.holdings import sharing_of, team_usage
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.selectors import placement_request
from fleet.core.models import Team
from fleet.inventory.models import Gpu, GpuHealth, HostStatus, SharingMode
from fleet.partitioning.converters import catalog_product
from fleet.placement.quota import Usage, plus, replica_demand
from fleet.placement.sharing import Standing, Verdict, others_deserved_need, sharing_verdict


def _schedulable_gpus() -> list[Gpu]:
    return list(
        Gpu.objects.filter(host__status=HostStatus.READY, cordoned=False)
        .exclude(health__in=(GpuHealth.UNHEALTHY, GpuHealth.LOST))
        .order_by("pk")
    )


def free_capacity() -> Usage:
    """What no replica holds on schedulable GPUs: whole GPUs with nothing on them, the compute
    slices of MIG GPUs outside occupied instances, the memory of MPS GPUs not reserved.
    A releasing replica still holds its slice."""
    gpus = _schedulable_gpus()
    rows = Allocation.objects.filter(gpu__in=gpus).values("gpu_id")
    held = {
        row["gpu_id"]: (row["n"], row["mib"] or 0)
        for row in rows.annotate(n=Count("pk"), mib=Sum("memory_mib")).order_by()
    }
    occupied_slices: dict[int, int] = defaultdict(int)
    taken = (
        Allocation.objects.filter(gpu__in=gpus, kind="mig")
        .values("partition_id", "gpu_id", "partition__compute_slices")
        .distinct()
    )
    for row in taken:
        occupied_slices[row["gpu_id"]] += row["partition__compute_slices"] or 0
    whole, slices, mps = 0, 0, 0
    for gpu in gpus:
        count, mib = held.get(gpu.pk, (0, 0))
        if gpu.mode == SharingMode.DEDICATED:
            whole += int(count == 0)
        elif gpu.mode == SharingMode.MPS:
            mps += max(0, gpu.memory_mib - mib)
        else:
            product = catalog_product(gpu)
            total = product.compute_slice_count if product is not None else 0
            slices += max(0, total - occupied_slices[gpu.pk])
    return Usage(gpus=whole, mig_compute_slices=slices, mps_memory_mib=mps)


def waiting_demand(team_id: int) -> Usage:
    """What the team's replicas without a place ask for (deployments being deleted aside)."""
    placed = dict(
        Allocation.objects.placed()
        .filter(deployment__team_id=team_id)
        .values("deployment")
        .annotate(n=Count("replica", distinct=True))
        .values_list("deployment", "n")
    )
    total = Usage()
    for deployment in Deployment.objects.filter(team_id=team_id, deleting=False):
        for _ in range(max(0, deployment.replicas - placed.get(deployment.pk, 0))):
            total = plus(total, replica_demand(placement_request(deployment)))
    return total


def others_need(team_id: int) -> Usage:
    """What every other team's deserved share needs now (:func:`deserved_need`)."""
    sharing, held, waiting = {}, {}, {}
    for team in Team.objects.exclude(pk=team_id):
        if not team.has_quota:
            continue
        waiting[team.pk] = waiting_demand(team.pk)
        if waiting[team.pk] != Usage():
            sharing[team.pk], held[team.pk] = sharing_of(team), team_usage(team.pk)
    return others_deserved_need(team_id, sharing, held, waiting)


def fleet_standing() -> Standing:
    """Where every bounded team stands now (its sharing, holdings and waiting demand) and the
    fleet's free capacity: :func:`admission` of any team, in memory, for a sequence of
    placements (:meth:`Standing.after`)."""
    sharing, held, waiting = {}, {}, {}
    for team in Team.objects.all():
        if team.shares_bounded:
            sharing[team.pk] = sharing_of(team)
            held[team.pk], waiting[team.pk] = team_usage(team.pk), waiting_demand(team.pk)
    return Standing(sharing, held, waiting, free_capacity())


def admission(team: Team, in_use: Usage, demand: Usage) -> Verdict:
    """The team's sharing verdict on ``demand`` more (fleet capacity read only when it would
    borrow)."""
    sharing = sharing_of(team)
    verdict = sharing_verdict(sharing, in_use, demand, Usage(), Usage())
    if not verdict.borrowed:
        return verdict
    return sharing_verdict(sharing, in_use, demand, free_capacity(), others_need(team.pk))
