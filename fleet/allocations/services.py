"""Writes on workloads: create deployments, place replicas on partitions or GPUs, evict, delete.

A placement locks the deployment, then the host, then the GPU rows, checks capacity with the
pure rules (``fleet.mig``, ``fleet.mps``) against the allocations already committed, and writes
the allocation, the new desired generation and an operation in one transaction; the push to
the agent is scheduled on commit. Two racing placements serialise on the GPU row lock, so a
GPU is never over-committed; the unique constraints catch what a lock could miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from fleet.allocations.models import Allocation, Deployment, RequestKind
from fleet.core.errors import Conflict, NotFound, RuleViolation, ServiceError
from fleet.domain import Violation
from fleet.inventory.models import Gpu, Host, SharingMode
from fleet.mig import Instance, Profile, free_placements, suggest_layout
from fleet.mps import MpsRequest, check_fit, validate_request
from fleet.partitioning import converters
from fleet.partitioning.models import Operation, OperationKind, Partition, PartitionKind
from fleet.partitioning.services import (
    gpu_is_schedulable,
    host_bump_generation,
    lock_gpu,
    operation_record,
    schedule_push,
)


@dataclass(frozen=True)
class DeploymentRequest:
    kind: str
    profile: str = ""
    memory_mib: int | None = None
    max_compute_percent: int | None = None
    gpu_count: int | None = None


def _validate_request(request: DeploymentRequest) -> None:
    if request.kind == RequestKind.MPS:
        violations = validate_request(
            MpsRequest(
                memory_mib=request.memory_mib or 0, max_compute_percent=request.max_compute_percent
            )
        )
        if violations:
            raise RuleViolation("The MPS request is not valid.", violations)
    elif request.kind == RequestKind.MIG:
        if not request.profile.strip():
            raise ServiceError(
                "deployment.profile_required", "A MIG request needs a profile such as '1g.10gb'."
            )
    elif request.kind == RequestKind.GPU:
        if not request.gpu_count or request.gpu_count < 1:
            raise ServiceError(
                "deployment.gpu_count_required", "A whole-GPU request needs gpu_count >= 1."
            )
    else:
        raise ServiceError(
            "deployment.invalid_kind",
            f"Unknown request kind {request.kind!r}.",
            {"kinds": RequestKind.values},
        )


@transaction.atomic
def deployment_create(
    *,
    name: str,
    request: DeploymentRequest,
    replicas: int,
    auto: bool = False,
    requested_by: Any = None,
) -> Deployment:
    """A new workload; with ``auto`` the placement engine places every replica it can."""
    _validate_request(request)
    if Deployment.objects.filter(name=name).exists():
        raise Conflict(
            "deployment.name_taken", f"A deployment named {name!r} already exists.", {"name": name}
        )
    deployment = Deployment.objects.create(
        name=name,
        kind=request.kind,
        profile=request.profile.strip() if request.kind == RequestKind.MIG else "",
        memory_mib=request.memory_mib if request.kind == RequestKind.MPS else None,
        max_compute_percent=request.max_compute_percent
        if request.kind == RequestKind.MPS
        else None,
        gpu_count=request.gpu_count if request.kind == RequestKind.GPU else None,
        replicas=replicas,
        created_by=requested_by if getattr(requested_by, "is_authenticated", False) else None,
    )
    operation_record(
        kind=OperationKind.CREATE_DEPLOYMENT,
        summary=f"Created deployment {name} ({describe_request(deployment)})",
        requested_by=requested_by,
        deployment=deployment,
        status="succeeded",
        payload={"replicas": replicas, "request": request_payload(deployment)},
    )
    if auto:
        from fleet.allocations.autoplace import deployment_autoplace

        deployment_autoplace(deployment_id=deployment.pk, requested_by=requested_by)
    return deployment


def describe_request(deployment: Deployment) -> str:
    if deployment.kind == RequestKind.MIG:
        return f"MIG {deployment.profile} x{deployment.replicas}"
    if deployment.kind == RequestKind.MPS:
        cap = (
            f", {deployment.max_compute_percent}% compute" if deployment.max_compute_percent else ""
        )
        return f"MPS {deployment.memory_mib} MiB{cap} x{deployment.replicas}"
    return f"{deployment.gpu_count} GPU(s) x{deployment.replicas}"


def request_payload(deployment: Deployment) -> dict[str, Any]:
    return {
        "kind": deployment.kind,
        "profile": deployment.profile or None,
        "memory_mib": deployment.memory_mib,
        "max_compute_percent": deployment.max_compute_percent,
        "gpu_count": deployment.gpu_count,
    }


def _lock_deployment(deployment_id: int) -> Deployment:
    deployment = Deployment.objects.select_for_update().filter(pk=deployment_id).first()
    if deployment is None:
        raise NotFound(
            "deployment.not_found",
            f"Deployment {deployment_id} does not exist.",
            {"deployment": deployment_id},
        )
    return deployment


def _next_replica(deployment: Deployment) -> int:
    placed = set(deployment.allocations.values_list("replica", flat=True))
    for replica in range(deployment.replicas):
        if replica not in placed:
            return replica
    raise Conflict(
        "deployment.fully_placed",
        f"All {deployment.replicas} replica(s) of {deployment.name} are already placed.",
        {"replicas": deployment.replicas},
    )


def _refuse(message: str, violations: list[Violation], **details: Any) -> RuleViolation:
    return RuleViolation(message, violations, **details)


@transaction.atomic
def deployment_place(
    *,
    deployment_id: int,
    partition_id: int | None = None,
    gpu_id: int | None = None,
    start: int | None = None,
    requested_by: Any = None,
) -> Operation:
    """Place the next unplaced replica on a partition or a GPU (what a drop in the UI calls).

    On a MIG GPU without a free partition of the profile, a new instance is created in free
    space, at ``start`` when given (the placement engine's choice), never touching other
    instances.
    """
    if (partition_id is None) == (gpu_id is None):
        raise ServiceError("place.target_required", "Give exactly one of 'partition' or 'gpu'.")
    deployment = _lock_deployment(deployment_id)
    replica = _next_replica(deployment)
    if partition_id is not None:
        target_gpu_id = (
            Partition.objects.filter(pk=partition_id).values_list("gpu_id", flat=True).first()
        )
        if target_gpu_id is None:
            raise NotFound(
                "partition.not_found",
                f"Partition {partition_id} does not exist.",
                {"partition": partition_id},
            )
    else:
        assert gpu_id is not None
        target_gpu_id = gpu_id
    gpu = lock_gpu(target_gpu_id)
    reasons = gpu_is_schedulable(gpu)
    if reasons:
        raise _refuse(f"{gpu} does not take new work.", reasons)
    try:
        with transaction.atomic():
            allocations, created = _bind(deployment, replica, gpu, partition_id, start)
    except IntegrityError:
        raise Conflict(
            "place.conflict", "The target was taken by a concurrent change; try again."
        ) from None
    generation = host_bump_generation(gpu.host_id)
    Allocation.objects.filter(pk__in=[a.pk for a in allocations]).update(generation=generation)
    target = ", ".join(str(a.partition) for a in allocations)
    operation = operation_record(
        kind=OperationKind.PLACE,
        summary=f"Placed {deployment.name}[{replica}] on {target}",
        requested_by=requested_by,
        gpu=gpu,
        deployment=deployment,
        generation=generation,
        payload={
            "replica": replica,
            "allocations": [a.pk for a in allocations],
            "partitions": [a.partition_id for a in allocations],
            "created_partition": created,
        },
    )
    schedule_push(gpu.host_id)
    return operation


def _bind(
    deployment: Deployment, replica: int, gpu: Gpu, partition_id: int | None, start: int | None
) -> tuple[list[Allocation], int | None]:
    if deployment.kind == RequestKind.MIG:
        return _bind_mig(deployment, replica, gpu, partition_id, start)
    if deployment.kind == RequestKind.MPS:
        return [_bind_mps(deployment, replica, gpu, partition_id)], None
    return _bind_whole(deployment, replica, gpu, partition_id), None


def _wanted_profile(deployment: Deployment, gpu: Gpu) -> Profile:
    product = converters.product_of(gpu)
    profile = product.profile(deployment.profile) if product is not None else None
    if profile is None:
        known = [p.name for p in product.profiles] if product is not None else []
        raise _refuse(
            f"{gpu.product_name} has no MIG profile {deployment.profile!r}.",
            [
                Violation(
                    "placement.profile_unavailable",
                    f"{gpu.product_name} offers no {deployment.profile}.",
                    {"known_profiles": known},
                )
            ],
        )
    return profile


def _bind_mig(
    deployment: Deployment, replica: int, gpu: Gpu, partition_id: int | None, start: int | None
) -> tuple[list[Allocation], int | None]:
    if gpu.mode != SharingMode.MIG:
        raise _refuse(
            f"{gpu} is in {gpu.mode} mode; a MIG request needs a MIG partition.",
            [
                Violation(
                    "placement.mode_mismatch", f"{gpu} is not in MIG mode.", {"mode": gpu.mode}
                )
            ],
        )
    profile = _wanted_profile(deployment, gpu)
    partitions = list(gpu.partitions.filter(kind=PartitionKind.MIG))
    taken = set(
        Allocation.objects.filter(partition__in=partitions).values_list("partition_id", flat=True)
    )
    created: int | None = None
    if partition_id is not None:
        partition = next((p for p in partitions if p.pk == partition_id), None)
        if partition is None or partition.profile_id != profile.id:
            raise _refuse(
                f"That partition is not a {profile.name} instance.",
                [
                    Violation(
                        "placement.profile_mismatch",
                        f"Needs {profile.name}; the partition is "
                        f"{getattr(partition, 'profile_name', 'not MIG')}.",
                    )
                ],
            )
        if partition.pk in taken:
            raise _refuse(
                f"{partition} is already in use.",
                [Violation("placement.partition_busy", f"{partition} already runs a replica.")],
            )
    else:
        partition = next(
            (p for p in partitions if p.profile_id == profile.id and p.pk not in taken), None
        )
        if partition is None:
            partition = _new_mig_partition(gpu, profile, partitions, start)
            created = partition.pk
    allocation = Allocation.objects.create(
        deployment=deployment,
        replica=replica,
        kind=RequestKind.MIG,
        gpu=gpu,
        partition=partition,
        memory_mib=partition.memory_mib,
    )
    return [allocation], created


def _new_mig_partition(
    gpu: Gpu, profile: Profile, partitions: list[Partition], start: int | None
) -> Partition:
    """Create an instance in free space, never touching existing (busy or idle) instances."""
    product = converters.product_of(gpu)
    assert product is not None
    existing = converters.mig_instances(partitions)
    if start is None:
        new = suggest_layout(product, [profile.id], existing)
    else:
        free = {p.start for p in free_placements(product, profile.id, existing)}
        new = (Instance(profile_id=profile.id, start=start),) if start in free else None
    if not new:
        raise _refuse(
            f"No free space for a {profile.name} instance on {gpu}.",
            [
                Violation(
                    "placement.no_free_space", f"No {profile.name} placement is free on {gpu}."
                )
            ],
        )
    instance = new[0]
    return Partition.objects.create(
        gpu=gpu,
        kind=PartitionKind.MIG,
        profile_id=profile.id,
        profile_name=profile.name,
        start=instance.start,
        size=profile.placement_at(instance.start).size,
        compute_slices=profile.compute_slices,
        memory_mib=profile.memory_mib,
    )


def _bind_mps(
    deployment: Deployment, replica: int, gpu: Gpu, partition_id: int | None
) -> Allocation:
    candidates = [p for p in gpu.partitions.all() if p.mps_enabled]
    if partition_id is not None:
        candidates = [p for p in candidates if p.pk == partition_id]
    if not candidates:
        raise _refuse(
            f"{gpu} has no MPS partition there; set an MPS policy on it first.",
            [
                Violation(
                    "placement.mode_mismatch",
                    f"No MPS daemon runs on the target on {gpu}.",
                    {"mode": gpu.mode},
                )
            ],
        )
    assert deployment.memory_mib is not None
    request = MpsRequest(
        memory_mib=deployment.memory_mib, max_compute_percent=deployment.max_compute_percent
    )
    product = converters.product_of(gpu)
    refusals: list[Violation] = []
    for partition in candidates:
        existing = [
            MpsRequest(a.memory_mib, a.compute_percent)
            for a in partition.allocations.filter(kind=RequestKind.MPS)
        ]
        if partition.allocations.exclude(kind=RequestKind.MPS).exists():
            refusals.append(
                Violation(
                    "placement.partition_busy",
                    f"{partition} is taken by a whole-partition workload.",
                )
            )
            continue
        violations = check_fit(
            converters.mps_device(partition, product),
            existing,
            request,
            converters.mps_policy(partition),
        )
        if not violations:
            return Allocation.objects.create(
                deployment=deployment,
                replica=replica,
                kind=RequestKind.MPS,
                gpu=gpu,
                partition=partition,
                memory_mib=deployment.memory_mib,
                compute_percent=deployment.max_compute_percent,
            )
        refusals.extend(violations)
    raise _refuse(f"{deployment.name} does not fit on {gpu}.", refusals)


def _bind_whole(
    deployment: Deployment, replica: int, gpu: Gpu, partition_id: int | None
) -> list[Allocation]:
    if gpu.mode != SharingMode.DEDICATED:
        raise _refuse(
            f"{gpu} is shared ({gpu.mode}); a whole-GPU request needs a dedicated GPU.",
            [
                Violation(
                    "placement.mode_mismatch", f"{gpu} is in {gpu.mode} mode.", {"mode": gpu.mode}
                )
            ],
        )
    count = deployment.gpu_count or 1
    others = [
        g
        for g in Gpu.objects.select_for_update()
        .filter(host_id=gpu.host_id, mode=SharingMode.DEDICATED)
        .exclude(pk=gpu.pk)
        .order_by("index")
        if not gpu_is_schedulable(g)
    ]
    chosen: list[Gpu] = []
    for candidate in [gpu, *others]:
        whole = candidate.partitions.filter(kind=PartitionKind.GPU).first()
        if whole is None or whole.allocations.exists():
            if candidate.pk == gpu.pk:
                raise _refuse(
                    f"{gpu} is already in use.",
                    [Violation("placement.gpu_busy", f"{gpu} already runs a workload.")],
                )
            continue
        if partition_id is not None and candidate.pk == gpu.pk and whole.pk != partition_id:
            raise _refuse(
                "That partition is not a whole GPU.",
                [Violation("placement.mode_mismatch", "Not a whole-GPU partition.")],
            )
        chosen.append(candidate)
        if len(chosen) == count:
            break
    if len(chosen) < count:
        raise _refuse(
            f"Host {gpu.host.name} has {len(chosen)} free dedicated GPU(s); "
            f"{deployment.name} needs {count}.",
            [
                Violation(
                    "placement.no_free_gpus",
                    f"Needs {count} free GPUs on one host, found {len(chosen)}.",
                    {"needed": count, "free": len(chosen)},
                )
            ],
        )
    allocations = []
    for slot, target in enumerate(chosen):
        whole = target.partitions.get(kind=PartitionKind.GPU)
        allocations.append(
            Allocation.objects.create(
                deployment=deployment,
                replica=replica,
                gpu_slot=slot,
                kind=RequestKind.GPU,
                gpu=target,
                partition=whole,
                memory_mib=target.memory_mib,
            )
        )
    return allocations


@transaction.atomic
def deployment_evict(
    *, deployment_id: int, replica: int | None = None, requested_by: Any = None
) -> list[Operation]:
    """Release the deployment's allocations (all replicas, or one); its partitions stay."""
    deployment = _lock_deployment(deployment_id)
    allocations = deployment.allocations.all()
    if replica is not None:
        allocations = allocations.filter(replica=replica)
    by_host: dict[int, list[Allocation]] = {}
    for allocation in allocations.select_related("gpu", "partition"):
        by_host.setdefault(allocation.gpu.host_id, []).append(allocation)
    if not by_host:
        raise Conflict("deployment.not_placed", f"{deployment.name} has nothing placed to evict.")
    operations = []
    for host_id in sorted(by_host):
        Host.objects.select_for_update().get(pk=host_id)
        evicted = by_host[host_id]
        Allocation.objects.filter(pk__in=[a.pk for a in evicted]).delete()
        generation = host_bump_generation(host_id)
        replicas = sorted({a.replica for a in evicted})
        operations.append(
            operation_record(
                kind=OperationKind.EVICT,
                summary=f"Evicted {deployment.name} replicas {replicas}",
                requested_by=requested_by,
                host=Host.objects.get(pk=host_id),
                deployment=deployment,
                generation=generation,
                payload={"replicas": replicas, "gpus": sorted({a.gpu_id for a in evicted})},
            )
        )
        schedule_push(host_id)
    return operations


@transaction.atomic
def deployment_delete(*, deployment_id: int, requested_by: Any = None) -> None:
    deployment = _lock_deployment(deployment_id)
    if deployment.allocations.exists():
        deployment_evict(deployment_id=deployment_id, requested_by=requested_by)
    operation_record(
        kind=OperationKind.DELETE_DEPLOYMENT,
        summary=f"Deleted deployment {deployment.name}",
        requested_by=requested_by,
        status="succeeded",
        payload={"name": deployment.name},
    )
    deployment.delete()
