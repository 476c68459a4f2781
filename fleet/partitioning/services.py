"""Writes on desired state: GPU layouts (MIG, MPS, dedicated), cordons, and the generation
counter that tells agents something changed.

Every write runs in one transaction, locks the host and then the GPU rows (always in that order,
so two writers never deadlock), validates with the pure rules, writes rows, bumps the host's
desired generation, records an :class:`Operation`, and schedules the push on commit.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from fleet.core.errors import Conflict, RuleViolation, ServiceError
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.domain import Violation
from fleet.inventory.models import Gpu, SharingMode
from fleet.mig import Instance, Product, resolve_instances, validate_layout
from fleet.mps import MpsDevice, MpsPolicy, validate_policy
from fleet.partitioning import converters
from fleet.partitioning.desired import host_bump_generation, lock_gpu, schedule_push
from fleet.partitioning.models import Partition, PartitionKind

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MigInstanceSpec:
    """A wanted MIG instance: a profile (id or name), its start slice, and optional MPS inside."""

    profile: int | str
    start: int
    mps: MpsPolicy | None = None


@dataclass(frozen=True)
class LayoutSpec:
    """A GPU's wanted layout. Its one JSON form is the layout API's body
    (``{"mode", "instances": [{"profile", "start", "mps"}], "mps"}``): :meth:`from_json` reads
    it (the API, a drain's stored payload), :meth:`as_json` writes it."""

    mode: str
    instances: tuple[MigInstanceSpec, ...] = ()
    mps: MpsPolicy | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> LayoutSpec:
        """The spec a JSON layout describes (profile ids stay integers, names strings)."""
        return cls(
            mode=raw["mode"],
            instances=tuple(
                MigInstanceSpec(i["profile"], i["start"], _policy_from(i.get("mps")))
                for i in raw.get("instances") or ()
            ),
            mps=_policy_from(raw.get("mps")),
        )

    def as_json(self) -> dict[str, Any]:
        """The JSON layout that recreates this spec."""
        return {
            "mode": self.mode,
            "instances": [
                {"profile": i.profile, "start": i.start, "mps": _policy_json(i.mps)}
                for i in self.instances
            ],
            "mps": _policy_json(self.mps),
        }


def _policy_from(raw: Mapping[str, Any] | None) -> MpsPolicy | None:
    return MpsPolicy.from_dict(raw) if raw is not None else None


def _policy_json(policy: MpsPolicy | None) -> dict[str, int | None] | None:
    return policy.as_dict() if policy is not None else None


def _require_product(gpu: Gpu) -> Product:
    product = converters.product_of(gpu)
    if product is None:
        raise RuleViolation(
            f"{gpu.product_name!r} is not in the MIG catalog and its agent reported no placements.",
            [Violation("mig.unknown_product", f"Unknown GPU product {gpu.product_name!r}.")],
        )
    return product


def _resolve_instances(product: Product, specs: tuple[MigInstanceSpec, ...]) -> list[Instance]:
    instances, unknown = resolve_instances(product, [(s.profile, s.start) for s in specs])
    if unknown:
        raise RuleViolation(
            f"{product.name} has no MIG profile {unknown[0].details['profile']!r}.",
            unknown,
            known_profiles=[p.name for p in product.profiles],
        )
    return list(instances)


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
    """Write a policy on the partition's row (the one policy -> row; row -> policy is
    :func:`converters.mps_policy`)."""
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


def layout_disturbed_partitions(*, gpu_id: int, spec: LayoutSpec) -> set[int]:
    """The partitions of the GPU that a change to ``spec`` would destroy or give another MPS
    policy: their replicas must leave before it is applied. The others (same profile and start,
    same policy) keep theirs through the change. Raises as :func:`gpu_set_layout` would for a
    layout that is not valid here."""
    gpu = Gpu.objects.get(pk=gpu_id)
    partitions = list(gpu.partitions.all())
    if spec.mode == SharingMode.MIG:
        keep, _, drop = _plan_mig(gpu, spec, partitions)
    else:
        keep, _, drop = _plan_whole(gpu, spec, partitions, converters.product_of(gpu))
    if gpu.mode != spec.mode:
        return {p.pk for p in partitions}
    return {p.pk for p in drop} | {p.pk for p, policy in keep if _mps_changed(p, policy)}


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
    summary = f"Set {gpu} to {_describe(spec, product)}"
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
        partition = converters.mig_partition(gpu, profile, instance.start)
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


def _describe(spec: LayoutSpec, product: Product | None) -> str:
    """``MIG 3g.40gb@0, 3g.40gb@4`` (profile names, as people read them, never NVML ids)."""
    if spec.mode == SharingMode.MIG:
        found = [(product.profile(i.profile) if product else None, i) for i in spec.instances]
        names = [f"{p.name if p else i.profile}@{i.start}" for p, i in found]
        return f"MIG {', '.join(names)}" if names else "MIG, no instances"
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
