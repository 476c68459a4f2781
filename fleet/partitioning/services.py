"""Writes on desired state: GPU layouts (MIG, MPS, dedicated), cordons, and the generation
counter that tells agents something changed.

Every write runs in one transaction, locks the host and then the GPU rows (always in that order,
so two writers never deadlock), validates with the pure rules, writes rows, bumps the host's
desired generation, records an :class:`Operation`, and schedules the push on commit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from fleet.core.errors import Conflict, NotFound, RuleViolation, ServiceError
from fleet.core.events import publish_changed
from fleet.domain import Violation
from fleet.inventory.models import Gpu, GpuHealth, Host, SharingMode
from fleet.mig import Instance, Product, validate_layout
from fleet.mps import MpsDevice, MpsPolicy, validate_policy
from fleet.partitioning import converters
from fleet.partitioning.models import (
    Operation,
    OperationKind,
    OperationStatus,
    Partition,
    PartitionKind,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MigInstanceSpec:
    """A wanted MIG instance: a profile (id or name), its start slice, and optional MPS inside."""

    profile: int | str
    start: int
    mps: MpsPolicy | None = None


@dataclass(frozen=True)
class LayoutSpec:
    mode: str
    instances: tuple[MigInstanceSpec, ...] = ()
    mps: MpsPolicy | None = None


def lock_gpu(gpu_id: int) -> Gpu:
    """Lock the GPU's host, then the GPU, for the rest of the transaction."""
    host_id = Gpu.objects.filter(pk=gpu_id).values_list("host_id", flat=True).first()
    if host_id is None:
        raise NotFound("gpu.not_found", f"GPU {gpu_id} does not exist.", {"gpu": gpu_id})
    Host.objects.select_for_update().get(pk=host_id)
    return Gpu.objects.select_for_update().select_related("host").get(pk=gpu_id)


def host_bump_generation(host_id: int) -> int:
    """Increment the host's desired generation (inside the caller's transaction) and return it."""
    Host.objects.filter(pk=host_id).update(desired_generation=F("desired_generation") + 1)
    return int(Host.objects.values_list("desired_generation", flat=True).get(pk=host_id))


def schedule_push(host_id: int) -> None:
    """After commit, ask a worker to push the host's current desired state to its agent."""

    def enqueue() -> None:
        from fleet.tasks import push_desired_state  # the thin task layer; imported late

        push_desired_state.delay(host_id)

    transaction.on_commit(enqueue)


def operation_record(
    *,
    kind: str,
    summary: str,
    requested_by: Any = None,
    gpu: Gpu | None = None,
    host: Host | None = None,
    deployment: Any = None,
    generation: int | None = None,
    payload: dict[str, Any] | None = None,
    status: str = OperationStatus.PENDING,
    reason: str = "",
) -> Operation:
    final = status in (OperationStatus.SUCCEEDED, OperationStatus.FAILED, OperationStatus.EXPIRED)
    operation = Operation.objects.create(
        kind=kind,
        summary=summary[:255],
        requested_by=requested_by if getattr(requested_by, "is_authenticated", False) else None,
        gpu=gpu,
        host=host or (gpu.host if gpu is not None else None),
        deployment=deployment,
        generation=generation,
        payload=payload or {},
        status=status,
        reason=reason,
        finished_at=timezone.now() if final else None,
    )
    publish_changed("operation", [operation.pk])
    if operation.gpu_id is not None:
        publish_changed("gpu", [operation.gpu_id])
    if operation.deployment_id is not None:
        publish_changed("deployment", [operation.deployment_id])
    if operation.host_id is not None:
        publish_changed("host", [operation.host_id])
    return operation


def _require_product(gpu: Gpu) -> Product:
    product = converters.product_of(gpu)
    if product is None:
        raise RuleViolation(
            f"{gpu.product_name!r} is not in the MIG catalog and its agent reported no placements.",
            [Violation("mig.unknown_product", f"Unknown GPU product {gpu.product_name!r}.")],
        )
    return product


def _resolve_instances(product: Product, specs: tuple[MigInstanceSpec, ...]) -> list[Instance]:
    unknown = [s.profile for s in specs if product.profile(s.profile) is None]
    if unknown:
        known = ", ".join(p.name for p in product.profiles)
        raise RuleViolation(
            f"{product.name} has no MIG profile {unknown[0]!r} (known: {known}).",
            [
                Violation(
                    "mig.unknown_profile",
                    f"Unknown profile {ref!r} on {product.name}.",
                    {"profile": ref},
                )
                for ref in unknown
            ],
            known_profiles=[p.name for p in product.profiles],
        )
    resolved = []
    for spec in specs:
        profile = product.profile(spec.profile)
        assert profile is not None
        resolved.append(Instance(profile_id=profile.id, start=spec.start))
    return resolved


def _busy_partitions(partitions: list[Partition]) -> list[dict[str, Any]]:
    busy = []
    for partition in partitions:
        names = sorted({a.deployment.name for a in partition.allocations.all()})
        if names:
            busy.append({"partition": partition.pk, "label": str(partition), "deployments": names})
    return busy


def _check_mps_policy(device: MpsDevice, policy: MpsPolicy, where: str) -> None:
    violations = validate_policy(device, policy)
    if violations:
        raise RuleViolation(f"Invalid MPS policy for {where}.", violations)


def _apply_mps(partition: Partition, policy: MpsPolicy | None) -> None:
    partition.mps_enabled = policy is not None
    effective = policy or MpsPolicy()
    partition.mps_default_active_thread_percentage = effective.default_active_thread_percentage
    partition.mps_default_pinned_mem_limit_mib = effective.default_pinned_mem_limit_mib
    partition.mps_max_clients = effective.max_clients


def _check_mps_allocations_still_fit(
    partition: Partition, policy: MpsPolicy | None, product: Product | None
) -> None:
    allocations = [a for a in partition.allocations.all() if a.kind == "mps"]
    if not allocations:
        return
    if policy is None:
        raise Conflict(
            "layout.partition_in_use",
            f"{partition} runs MPS clients; evict or drain them before turning MPS off.",
            {"busy": _busy_partitions([partition])},
        )
    device = converters.mps_device(partition, product)
    limit = policy.max_clients or device.max_clients
    over_memory = policy.default_pinned_mem_limit_mib is not None and any(
        a.memory_mib > policy.default_pinned_mem_limit_mib for a in allocations
    )
    if len(allocations) > limit or over_memory:
        raise Conflict(
            "layout.mps_policy_conflicts_with_allocations",
            f"The new MPS policy of {partition} would not hold its "
            f"{len(allocations)} running client(s).",
            {"clients": len(allocations), "max_clients": limit},
        )


@transaction.atomic
def gpu_set_layout(*, gpu_id: int, spec: LayoutSpec, requested_by: Any = None) -> Operation:
    """Set a GPU's sharing mode and layout: MIG instances, an MPS policy, or dedicated use.

    Partitions that stay (same profile and start) keep their allocations; a partition that would
    be destroyed while it holds an allocation refuses the whole change (drain it first).
    """
    gpu = lock_gpu(gpu_id)
    if spec.mode not in SharingMode.values:
        raise ServiceError(
            "layout.invalid_mode", f"Unknown mode {spec.mode!r}.", {"modes": SharingMode.values}
        )
    partitions = list(gpu.partitions.prefetch_related("allocations__deployment"))
    product = converters.product_of(gpu)
    if spec.mode == SharingMode.MIG:
        keep, create, drop = _plan_mig(gpu, spec, partitions)
    else:
        keep, create, drop = _plan_whole(gpu, spec, partitions, product)
    busy = _busy_partitions(drop)
    if busy:
        raise Conflict(
            "layout.partition_in_use",
            "The new layout would destroy partitions that run workloads; "
            "evict or drain them first.",
            {"busy": busy},
        )
    changed = (
        bool(create or drop)
        or gpu.mode != spec.mode
        or any(_mps_changed(p, pol) for p, pol in keep)
    )
    for partition, policy in keep:
        _check_mps_allocations_still_fit(partition, policy, product)
        _apply_mps(partition, policy)
        partition.save()
    Partition.objects.filter(pk__in=[p.pk for p in drop]).delete()
    for partition in create:
        partition.save()
    gpu.mode = spec.mode
    gpu.mig_enabled = spec.mode == SharingMode.MIG
    gpu.save(update_fields=["mode", "mig_enabled", "updated_at"])
    summary = f"Set {gpu} to {_describe(spec)}"
    payload = {
        "mode": spec.mode,
        "partitions": [_partition_payload(p) for p in gpu.partitions.all()],
    }
    if not changed:
        return operation_record(
            kind=OperationKind.SET_LAYOUT,
            summary=summary,
            requested_by=requested_by,
            gpu=gpu,
            payload=payload,
            status=OperationStatus.SUCCEEDED,
            reason="No change: the GPU already has this layout.",
        )
    generation = host_bump_generation(gpu.host_id)
    operation = operation_record(
        kind=OperationKind.SET_LAYOUT,
        summary=summary,
        requested_by=requested_by,
        gpu=gpu,
        generation=generation,
        payload=payload,
    )
    schedule_push(gpu.host_id)
    return operation


def _mps_changed(partition: Partition, policy: MpsPolicy | None) -> bool:
    if policy is None:
        return partition.mps_enabled
    return not partition.mps_enabled or converters.mps_policy(partition) != policy


def _plan_mig(
    gpu: Gpu, spec: LayoutSpec, partitions: list[Partition]
) -> tuple[list[tuple[Partition, MpsPolicy | None]], list[Partition], list[Partition]]:
    product = _require_product(gpu)
    if not product.mig_capable or not gpu.mig_capable:
        raise RuleViolation(
            f"{gpu.product_name} does not support MIG.",
            [Violation("mig.not_supported", f"{gpu.product_name} does not support MIG.")],
        )
    instances = _resolve_instances(product, spec.instances)
    violations = validate_layout(product, instances)
    if violations:
        raise RuleViolation(f"The MIG layout is not valid on {product.name}.", violations)
    existing = {(p.profile_id, p.start): p for p in partitions if p.kind == PartitionKind.MIG}
    keep: list[tuple[Partition, MpsPolicy | None]] = []
    create: list[Partition] = []
    wanted_keys = set()
    for instance, instance_spec in zip(instances, spec.instances, strict=True):
        profile = product.profile(instance.profile_id)
        assert profile is not None
        key = (instance.profile_id, instance.start)
        wanted_keys.add(key)
        if instance_spec.mps is not None:
            device = MpsDevice.mig_instance(
                profile.memory_mib, profile.compute_slices, product.compute_slice_count
            )
            _check_mps_policy(device, instance_spec.mps, f"{profile.name}@{instance.start}")
        if key in existing:
            keep.append((existing[key], instance_spec.mps))
            continue
        partition = Partition(
            gpu=gpu,
            kind=PartitionKind.MIG,
            profile_id=profile.id,
            profile_name=profile.name,
            start=instance.start,
            size=profile.placement_at(instance.start).size,
            compute_slices=profile.compute_slices,
            memory_mib=profile.memory_mib,
        )
        _apply_mps(partition, instance_spec.mps)
        create.append(partition)
    drop = [
        p
        for p in partitions
        if p.kind != PartitionKind.MIG or (p.profile_id, p.start) not in wanted_keys
    ]
    return keep, create, drop


def _plan_whole(
    gpu: Gpu, spec: LayoutSpec, partitions: list[Partition], product: Product | None
) -> tuple[list[tuple[Partition, MpsPolicy | None]], list[Partition], list[Partition]]:
    if spec.instances:
        raise ServiceError(
            "layout.instances_need_mig_mode", "MIG instances can only be given with mode 'mig'."
        )
    policy = spec.mps if spec.mode == SharingMode.MPS else None
    if spec.mode == SharingMode.MPS:
        _check_mps_policy(MpsDevice.whole_gpu(gpu.memory_mib), policy or MpsPolicy(), str(gpu))
        policy = policy or MpsPolicy()
    elif spec.mps is not None:
        raise ServiceError(
            "layout.mps_needs_mps_mode", "An MPS policy can only be given with mode 'mps'."
        )
    whole = next((p for p in partitions if p.kind == PartitionKind.GPU), None)
    drop = [p for p in partitions if p is not whole]
    if whole is not None and gpu.mode != spec.mode and whole.allocations.exists():
        drop.append(whole)
        whole = None
    if whole is not None:
        return [(whole, policy)], [], drop
    partition = Partition(gpu=gpu, kind=PartitionKind.GPU, memory_mib=gpu.memory_mib)
    _apply_mps(partition, policy)
    return [], [partition], drop


def _describe(spec: LayoutSpec) -> str:
    if spec.mode == SharingMode.MIG:
        listed = ", ".join(f"{i.profile}@{i.start}" for i in spec.instances) or "no instances"
        return f"MIG [{listed}]"
    if spec.mode == SharingMode.MPS:
        return "MPS"
    return "dedicated"


def _partition_payload(partition: Partition) -> dict[str, Any]:
    return {
        "id": partition.pk,
        "kind": partition.kind,
        "profile_id": partition.profile_id,
        "profile": partition.profile_name,
        "start": partition.start,
        "size": partition.size,
        "mps_enabled": partition.mps_enabled,
    }


@transaction.atomic
def gpu_set_cordon(
    *, gpu_id: int, cordoned: bool, reason: str = "", requested_by: Any = None
) -> Operation:
    """Cordon (no new placements) or uncordon one GPU. Running work is left alone."""
    gpu = lock_gpu(gpu_id)
    gpu.cordoned = cordoned
    gpu.cordon_reason = reason if cordoned else ""
    gpu.save(update_fields=["cordoned", "cordon_reason", "updated_at"])
    kind = OperationKind.CORDON if cordoned else OperationKind.UNCORDON
    verb = "Cordoned" if cordoned else "Uncordoned"
    return operation_record(
        kind=kind,
        summary=f"{verb} {gpu}",
        requested_by=requested_by,
        gpu=gpu,
        status=OperationStatus.SUCCEEDED,
        reason=reason,
        payload={"cordoned": cordoned},
    )


def gpu_is_schedulable(gpu: Gpu) -> list[Violation]:
    """Why new work may not land on this GPU (empty when it may)."""
    reasons = []
    if gpu.cordoned:
        reasons.append(
            Violation("placement.cordoned", f"{gpu} is cordoned.", {"reason": gpu.cordon_reason})
        )
    if gpu.health in (GpuHealth.UNHEALTHY, GpuHealth.LOST):
        reasons.append(
            Violation(
                "placement.unhealthy", f"{gpu} is {gpu.health}.", {"reason": gpu.health_reason}
            )
        )
    if gpu.host.status in ("cordoned", "draining", "unhealthy", "offline"):
        reasons.append(
            Violation("placement.host_unavailable", f"Host {gpu.host.name} is {gpu.host.status}.")
        )
    return reasons
