"""Writes on workloads: create deployments, place replicas on partitions or GPUs, evict, delete.

A placement locks the deployment, then the host, then the GPU rows, reads the host's snapshot
under those locks, asks the placement engine for the verdict on the target (the rules the
preview ranks with), and writes what it answered: the allocation, the new desired generation and
an operation, in one transaction; the push to the agent is scheduled on commit. Two racing
placements serialise on the host row lock, so a GPU is never over-committed; the unique
constraints catch what a lock could miss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from fleet.allocations.models import Allocation, Deployment, RequestKind, describe_request
from fleet.allocations.quotas import quota_check
from fleet.allocations.reservations import reserve_target
from fleet.allocations.workloads import allocations_release, workload_from_input
from fleet.core.errors import Conflict, NotFound, RuleViolation, ServiceError
from fleet.core.models import Operation, OperationKind, Team, default_team_id
from fleet.core.operations import operation_record
from fleet.core.policy import policy_enforce
from fleet.core.registry import PIN_KEY, workload_pinned
from fleet.core.secrets import secrets_enforce
from fleet.inventory.labels import labels_checked
from fleet.inventory.models import Host
from fleet.mps import MpsRequest, validate_request
from fleet.partitioning.desired import (
    host_bump_generation,
    schedule_push,
)
from fleet.partitioning.models import Partition


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
    workload: Mapping[str, Any] | None = None,
    auto_place: bool = False,
    host_labels: Mapping[str, Any] | None = None,
    team_id: int | None = None,
    host_memory_mib: int | None = None,
    requested_by: Any = None,
) -> Deployment:
    """A new workload, its replicas waiting to be placed (``deployment_create_placed`` places
    them at once, and marks it ``auto_place``: replicas added later are placed by the engine
    too). ``workload``: what each replica runs (missing fields at their defaults; none given:
    runtime ``none``). ``host_labels``: labels every host of its replicas must carry.
    ``team_id``: its team (``None``: the ``default`` team), whose policy must allow the
    workload and ``host_memory_mib`` (each replica's host memory; ``None``: the policy's
    default), else 422 ``policy.*`` (:mod:`fleet.core.policy`); its env may refer to the
    team's secrets only, else 422 ``secret.not_found`` (:mod:`fleet.core.secrets`). A
    container's image is pinned to the digest its registry serves now, when one answers
    (:func:`fleet.core.registry.image_pin`, within a few seconds, before any row is locked)."""
    _validate_request(request)
    checked = workload_from_input(workload)
    required = labels_checked(host_labels or {}, field="host_labels")
    existing = Deployment.objects.filter(name=name).first()
    if existing is not None and existing.deleting:
        raise Conflict(
            "deployment.deleting",
            f"A deployment named {name!r} is being deleted: its workloads are stopping. Try again "
            "when they have.",
            {"name": name},
        )
    if existing is not None:
        raise Conflict(
            "deployment.name_taken", f"A deployment named {name!r} already exists.", {"name": name}
        )
    team = Team.objects.filter(pk=team_id if team_id is not None else default_team_id()).first()
    if team is None:
        raise NotFound("team.not_found", f"Team {team_id} does not exist.", {"team": team_id})
    policy_enforce(team=team, workload=checked, host_memory_mib=host_memory_mib)
    stored = workload_pinned(checked, allowed=True, now=timezone.now())
    secrets_enforce(team=team, workload=checked)
    deployment = Deployment.objects.create(
        name=name,
        team=team,
        host_memory_mib=host_memory_mib,
        kind=request.kind,
        profile=request.profile.strip() if request.kind == RequestKind.MIG else "",
        memory_mib=request.memory_mib if request.kind == RequestKind.MPS else None,
        max_compute_percent=request.max_compute_percent
        if request.kind == RequestKind.MPS
        else None,
        gpu_count=request.gpu_count if request.kind == RequestKind.GPU else None,
        replicas=replicas,
        workload=stored,
        auto_place=auto_place,
        host_labels=required,
        created_by=requested_by if getattr(requested_by, "is_authenticated", False) else None,
    )
    operation_record(
        kind=OperationKind.CREATE_DEPLOYMENT,
        summary=(
            f"Created deployment {name} ({describe_request(deployment)} x{deployment.replicas})"
        ),
        requested_by=requested_by,
        deployment=deployment,
        status="succeeded",
        payload={
            "replicas": replicas,
            "request": request_payload(deployment),
            "runtime": checked["runtime"],
            "auto_place": auto_place,
            "team": deployment.team_id,
            "host_memory_mib": host_memory_mib,
            **({PIN_KEY: stored[PIN_KEY]} if PIN_KEY in stored else {}),
        },
    )
    return deployment


def request_payload(deployment: Deployment) -> dict[str, Any]:
    return {
        "kind": deployment.kind,
        "profile": deployment.profile or None,
        "memory_mib": deployment.memory_mib,
        "max_compute_percent": deployment.max_compute_percent,
        "gpu_count": deployment.gpu_count,
    }


def lock_deployment(deployment_id: int, allow_deleting: bool = False) -> Deployment:
    """Lock the deployment row (the first lock of every write on its replicas)."""
    deployment = Deployment.objects.select_for_update().filter(pk=deployment_id).first()
    if deployment is None:
        raise NotFound(
            "deployment.not_found",
            f"Deployment {deployment_id} does not exist.",
            {"deployment": deployment_id},
        )
    if deployment.deleting and not allow_deleting:
        raise Conflict(
            "deployment.deleting",
            f"{deployment.name} is being deleted: its workloads are stopping.",
            {"deployment": deployment_id},
        )
    return deployment


def _next_replica(deployment: Deployment) -> int:
    placed = set(deployment.allocations.placed().values_list("replica", flat=True))
    for replica in range(deployment.replicas):
        if replica not in placed:
            return replica
    raise Conflict(
        "deployment.fully_placed",
        f"All {deployment.replicas} replica(s) of {deployment.name} are already placed.",
        {"replicas": deployment.replicas},
    )


@transaction.atomic
def deployment_place(
    *,
    deployment_id: int,
    partition_id: int | None = None,
    gpu_id: int | None = None,
    start: int | None = None,
    over_quota_reason: str | None = None,
    requested_by: Any = None,
) -> Operation:
    """Place the next unplaced replica on a partition or a GPU (what a drop in the UI calls).

    The placement engine decides (:func:`fleet.placement.check`, the rules the preview ranks
    with) on a snapshot of the host read under its row lock; this service writes what it
    answered and re-implements no rule. On a MIG GPU without a free partition of the profile, a
    new instance is created in free space (at ``start`` when given: the engine's choice in a
    ranking), never touching other instances.

    The team's quota is checked first, under the team's row lock
    (:func:`fleet.allocations.quotas.quota_check`); ``over_quota_reason``: a fault's
    re-placement, allowed past the quota and recorded.
    """
    if (partition_id is None) == (gpu_id is None):
        raise ServiceError("place.target_required", "Give exactly one of 'partition' or 'gpu'.")
    deployment = lock_deployment(deployment_id)
    replica = _next_replica(deployment)
    borrowed = quota_check(
        deployment=deployment,
        replica=replica,
        over_quota_reason=over_quota_reason,
        requested_by=requested_by,
    )
    gpu_id = gpu_id if gpu_id is not None else _gpu_of_partition(partition_id)
    gpu, allocations, created, generation = reserve_target(
        deployment,
        replica,
        gpu_id=gpu_id,
        partition_id=partition_id,
        start=start,
        borrowed=borrowed,
    )
    target = ", ".join(str(a.partition) for a in allocations)
    operation = operation_record(
        kind=OperationKind.PLACE,
        summary=f"Placed {deployment.name}[{replica}] on {target}"
        + (" (borrowed)" if borrowed else ""),
        requested_by=requested_by,
        gpu=gpu,
        deployment=deployment,
        generation=generation,
        payload={
            "replica": replica,
            "allocations": [a.pk for a in allocations],
            "partitions": [a.partition_id for a in allocations],
            "created_partition": created,
            "borrowed": borrowed,
        },
    )
    schedule_push(gpu.host_id)
    return operation


def _gpu_of_partition(partition_id: int | None) -> int:
    assert partition_id is not None
    found = Partition.objects.filter(pk=partition_id).values_list("gpu_id", flat=True).first()
    if found is None:
        raise NotFound(
            "partition.not_found",
            f"Partition {partition_id} does not exist.",
            {"partition": partition_id},
        )
    return found


@transaction.atomic
def deployment_evict(
    *, deployment_id: int, replica: int | None = None, requested_by: Any = None
) -> list[Operation]:
    """Take the deployment's replicas (all, or one) off their slices; the partitions stay. A
    replica whose workload may still run keeps its slice, ``releasing``, until the agent has
    stopped it (:mod:`fleet.allocations.workloads`)."""
    deployment = lock_deployment(deployment_id)
    allocations = deployment.allocations.placed()
    if replica is not None:
        allocations = allocations.filter(replica=replica)
    if not allocations.exists():
        raise Conflict("deployment.not_placed", f"{deployment.name} has nothing placed to evict.")
    return allocations_evict(
        deployment=deployment, allocations=allocations, requested_by=requested_by
    )


def allocations_evict(
    *, deployment: Deployment, allocations: QuerySet[Allocation], requested_by: Any = None
) -> list[Operation]:
    """Evict these allocations of ``deployment``: per host (locked in id order, as placements
    lock them), release them, bump the desired generation, record an ``evict`` operation and
    push on commit. Call inside a transaction holding the deployment's row lock
    (:func:`lock_deployment`)."""
    by_host: dict[int, list[Allocation]] = {}
    for allocation in allocations.select_related("gpu__host", "partition", "deployment"):
        by_host.setdefault(allocation.gpu.host_id, []).append(allocation)
    operations = []
    for host_id in sorted(by_host):
        Host.objects.select_for_update().get(pk=host_id)
        evicted = by_host[host_id]
        stopping = allocations_release(evicted)
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
                payload={
                    "replicas": replicas,
                    "gpus": sorted({a.gpu_id for a in evicted}),
                    "stopping": sorted(a.pk for a in stopping),
                },
            )
        )
        schedule_push(host_id)
    return operations


@transaction.atomic
def deployment_delete(*, deployment_id: int, requested_by: Any = None) -> None:
    """Evict every replica and delete the deployment; while workloads still stop, it stays
    (``deleting``, its name taken) and goes with its last releasing replica."""
    deployment = lock_deployment(deployment_id)
    if deployment.allocations.placed().exists():
        deployment_evict(deployment_id=deployment_id, requested_by=requested_by)
    operation_record(
        kind=OperationKind.DELETE_DEPLOYMENT,
        summary=f"Deleted deployment {deployment.name}",
        requested_by=requested_by,
        status="succeeded",
        payload={"name": deployment.name},
    )
    if deployment.allocations.exists():
        Deployment.objects.filter(pk=deployment.pk).update(deleting=True)
    else:
        deployment.delete()
