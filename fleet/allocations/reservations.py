"""The step every placement shares (a place, a move's new copy): reserve a target on a GPU.

Under the target host's row lock, the placement engine checks the target on a snapshot of that
host (:func:`fleet.placement.check`, the rules the preview ranks with); what it answered is
written (the allocations, and the MIG instance it chose in free space), and the host's desired
generation bumped. The callers (:func:`fleet.allocations.services.deployment_place`,
:mod:`fleet.allocations.moves`) hold the deployment's lock, record their operation and schedule
the push.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, transaction

from fleet.allocations.claims import claim_violation
from fleet.allocations.models import Allocation, Deployment, RequestKind
from fleet.allocations.selectors import fleet_snapshot, placement_demand, placement_request
from fleet.core.errors import Conflict, RuleViolation
from fleet.inventory.models import Gpu
from fleet.mig import Instance
from fleet.partitioning import converters
from fleet.partitioning.desired import (
    host_bump_generation,
    lock_gpu,
)
from fleet.partitioning.models import Partition, PartitionKind
from fleet.placement import Refusal, Target, check


def reserve_target(
    deployment: Deployment,
    replica: int,
    *,
    gpu_id: int,
    partition_id: int | None,
    start: int | None,
    conflict: str = "place.conflict",
    replaces: Allocation | Sequence[Allocation] | None = None,
    workload: Any = None,
    borrowed: bool = False,
) -> tuple[Gpu, list[Allocation], int | None, int]:
    """The step every placement shares (a place, a move's new copy): under the target host's
    lock, the engine checks the target on a snapshot of that host (:func:`fleet.placement.check`,
    the rules the preview ranks with), its answer is written (:func:`write_target`) and the
    host's desired generation bumped and stamped on the new rows. The caller holds the
    deployment's lock, records its operation and schedules the push.

    Returns the locked GPU, the allocations written, the partition created (if any) and the
    generation.
    """
    claimed = claim_violation(deployment.pk, gpu_id)
    if claimed is not None:  # no cycling: a reclaim freed this GPU from this deployment
        raise RuleViolation(
            f"{deployment.name} may not go back there: {claimed.message}", [claimed]
        )
    gpu = lock_gpu(gpu_id)
    # The host row is locked: every writer of this host's partitions and allocations waits.
    snapshot = fleet_snapshot(host_ids=[gpu.host_id])
    verdict = check(
        snapshot,
        placement_request(deployment),
        gpu_id=gpu.pk,
        partition_id=partition_id,
        start=start,
        demand=placement_demand(deployment),
    )
    if isinstance(verdict, Refusal):
        raise RuleViolation(
            f"{deployment.name} does not fit on {gpu}: {verdict.violations[0].message}",
            verdict.violations,
        )
    try:
        with transaction.atomic():
            allocations, created = write_target(
                deployment,
                replica,
                gpu,
                verdict,
                replaces=replaces,
                workload=workload,
                borrowed=borrowed,
            )
    except IntegrityError:
        raise Conflict(
            conflict, "The target was taken by a concurrent change; try again."
        ) from None
    generation = host_bump_generation(gpu.host_id)
    Allocation.objects.filter(pk__in=[a.pk for a in allocations]).update(generation=generation)
    return gpu, allocations, created, generation


def write_target(
    deployment: Deployment,
    replica: int,
    gpu: Gpu,
    target: Target,
    replaces: Allocation | Sequence[Allocation] | None = None,
    workload: Any = None,
    borrowed: bool = False,
) -> tuple[list[Allocation], int | None]:
    """The allocations (and the MIG instance) the engine's target names; ``replaces``: the copy
    a move's new one runs beside (a replica of several GPUs: its allocations, in slot order,
    each replaced by the new allocation of its slot); ``workload``: what the copy runs
    (default: the deployment's workload now); ``borrowed``: placed past its team's deserved
    share (a move's new copy is borrowed when the copy it replaces is)."""
    runs = workload if workload is not None else deployment.workload
    olds = [replaces] if isinstance(replaces, Allocation) else list(replaces or ())
    if deployment.kind == RequestKind.GPU:
        wholes = {
            p.gpu_id: p
            for p in Partition.objects.filter(gpu_id__in=target.gpu_ids, kind=PartitionKind.GPU)
        }
        return [
            _allocation(
                deployment,
                replica,
                wholes[gpu_id],
                slot=slot,
                replaces=olds[slot] if slot < len(olds) else None,
                workload=runs,
                borrowed=borrowed,
            )
            for slot, gpu_id in enumerate(target.gpu_ids)
        ], None
    replaces = olds[0] if olds else None
    created: int | None = None
    if target.new_instance is not None:
        partition = _new_mig_partition(gpu, target.new_instance)
        created = partition.pk
    else:
        assert target.partition_id is not None  # a MIG or MPS target names its partition
        partition = Partition.objects.get(pk=target.partition_id, gpu=gpu)
    copy = _allocation(
        deployment, replica, partition, replaces=replaces, workload=runs, borrowed=borrowed
    )
    return [copy], created


def _allocation(
    deployment: Deployment,
    replica: int,
    partition: Partition,
    slot: int = 0,
    replaces: Allocation | None = None,
    workload: Any = None,
    borrowed: bool = False,
) -> Allocation:
    shared = deployment.kind == RequestKind.MPS
    return Allocation.objects.create(
        deployment=deployment,
        replica=replica,
        gpu_slot=slot,
        kind=deployment.kind,
        gpu_id=partition.gpu_id,
        partition=partition,
        memory_mib=int(deployment.memory_mib or 0) if shared else partition.memory_mib,
        compute_percent=deployment.max_compute_percent if shared else None,
        replaces=replaces,
        workload=workload,
        borrowed=borrowed or (replaces is not None and replaces.borrowed),
    )


def _new_mig_partition(gpu: Gpu, instance: Instance) -> Partition:
    """The MIG instance the engine chose, in free space beside every existing instance."""
    product = converters.product_of(gpu)
    profile = product.profile(instance.profile_id) if product is not None else None
    assert profile is not None  # the engine found it on this very product
    partition = converters.mig_partition(gpu, profile, instance.start)
    partition.save()
    return partition
