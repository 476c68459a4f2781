"""Candidate targets for a deployment's next replica, best first.

The place service re-checks every candidate under row locks, so this read may be stale.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from django.db.models import Count, Q, QuerySet, Sum

from fleet.allocations.models import Deployment, RequestKind
from fleet.inventory.models import Gpu, GpuHealth, SharingMode
from fleet.partitioning.models import Partition, PartitionKind


@dataclass(frozen=True)
class Target:
    gpu_id: int
    partition_id: int | None


def _schedulable_gpus() -> QuerySet[Gpu]:
    return (
        Gpu.objects.filter(cordoned=False)
        .exclude(health__in=[GpuHealth.UNHEALTHY, GpuHealth.LOST])
        .exclude(host__status__in=["cordoned", "draining", "unhealthy"])
    )


def candidate_targets(deployment: Deployment) -> Iterator[Target]:
    if deployment.kind == RequestKind.MIG:
        yield from _mig_targets(deployment)
    elif deployment.kind == RequestKind.MPS:
        yield from _mps_targets(deployment)
    else:
        yield from _whole_targets()


def _mig_targets(deployment: Deployment) -> Iterator[Target]:
    gpus = _schedulable_gpus().filter(mode=SharingMode.MIG)
    free = (
        Partition.objects.filter(gpu__in=gpus, kind=PartitionKind.MIG, allocations__isnull=True)
        .filter(
            Q(profile_name__iexact=deployment.profile)
            | Q(profile_name__iexact=deployment.profile.removeprefix("mig-"))
        )
        .order_by("gpu__host__name", "gpu__index", "start")
    )
    seen: set[int] = set()
    for partition in free:
        yield Target(partition.gpu_id, partition.pk)
    # Then GPUs with free space, fullest first, so empty GPUs stay whole for large profiles.
    used = gpus.annotate(slices=Sum("partitions__size")).order_by("-slices", "host__name", "index")
    for gpu in used:
        if gpu.pk not in seen:
            seen.add(gpu.pk)
            yield Target(gpu.pk, None)


def _mps_targets(deployment: Deployment) -> Iterator[Target]:
    partitions = (
        Partition.objects.filter(gpu__in=_schedulable_gpus(), mps_enabled=True)
        .annotate(reserved=Sum("allocations__memory_mib"), clients=Count("allocations"))
        .select_related("gpu")
    )
    need = deployment.memory_mib or 0
    fitting = [p for p in partitions if p.memory_mib - (p.reserved or 0) >= need]
    # Best fit: the least memory left after placing, so large holes stay for large requests.
    fitting.sort(key=lambda p: (p.memory_mib - (p.reserved or 0) - need, p.gpu_id, p.start))
    for partition in fitting:
        yield Target(partition.gpu_id, partition.pk)


def _whole_targets() -> Iterator[Target]:
    gpus = (
        _schedulable_gpus()
        .filter(
            mode=SharingMode.DEDICATED,
            partitions__kind=PartitionKind.GPU,
            partitions__allocations__isnull=True,
        )
        .order_by("host__name", "index")
    )
    for gpu in gpus:
        yield Target(gpu.pk, None)
