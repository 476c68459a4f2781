"""Reads for placement: the fleet snapshot the engine ranks, each deployment's request and demand,
and the fleet's request mix (rankings and defrag plans on top: :mod:`fleet.allocations.rankings`).

The snapshot is a read without locks; the place service re-checks every choice under row locks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.db.models import F, Sum

from fleet.allocations.models import Allocation, AllocationState, Deployment, RequestKind
from fleet.allocations.workloads import runtime_of
from fleet.core.models import Team
from fleet.core.policy import effective_policy
from fleet.inventory.models import HELD_STATUSES, Gpu, GpuHealth, Host, HostStatus, SharingMode
from fleet.mig import Product
from fleet.mps import MpsRequest
from fleet.partitioning import converters
from fleet.partitioning.models import Partition, PartitionKind
from fleet.placement import (
    Demand,
    FleetSnapshot,
    GpuState,
    HostState,
    MigPartition,
    MigRequest,
    MpsShare,
    PlacementRequest,
    RequestMix,
    RequestShape,
    WholeGpuRequest,
    shape_of,
)
from hostagent.protocol import RUNS_ON, declared_ports

UNAVAILABLE_HOST_STATUSES = (*HELD_STATUSES, HostStatus.UNHEALTHY)


def fleet_snapshot(host_ids: list[int] | None = None) -> FleetSnapshot:
    """Every host and GPU (or those of ``host_ids``) with its partitions, MPS daemons and
    reservations, in a stable order. The place service reads it under its row locks."""
    # Joined to the teams it is reserved for: one row per host and team (one row, the team
    # null, for a host without a reservation), still one query.
    hosts = Host.objects.annotate(
        reserved_team=F("reserved_for__id"), reserved_slug=F("reserved_for__slug")
    ).order_by("name", "pk", "reserved_team")
    gpus = Gpu.objects.select_related("host").order_by("host__name", "index")
    partition_rows = Partition.objects.order_by("gpu_id", "start")
    allocation_rows = Allocation.objects.only(
        "pk", "partition_id", "kind", "memory_mib", "compute_percent"
    ).order_by("pk")
    if host_ids is not None:
        hosts = hosts.filter(pk__in=host_ids)
        gpus = gpus.filter(host_id__in=host_ids)
        partition_rows = partition_rows.filter(gpu__host_id__in=host_ids)
        allocation_rows = allocation_rows.filter(gpu__host_id__in=host_ids)
    rows: dict[int, Host] = {}
    reserved: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for host in hosts:
        rows.setdefault(host.pk, host)
        if host.reserved_team is not None:
            reserved[host.pk].append((host.reserved_team, host.reserved_slug))
    partitions: dict[int, list[Partition]] = defaultdict(list)
    for partition in partition_rows:
        partitions[partition.gpu_id].append(partition)
    allocations: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in allocation_rows:
        allocations[allocation.partition_id].append(allocation)
    return FleetSnapshot(
        hosts=tuple(_host_state(host, reserved.get(pk, ())) for pk, host in rows.items()),
        gpus=tuple(_gpu_state(gpu, partitions[gpu.pk], allocations) for gpu in gpus),
    )


def _host_state(host: Host, reserved_for: Iterable[tuple[int, str]] = ()) -> HostState:
    return HostState(
        id=host.pk,
        healthy=host.status not in (HostStatus.UNHEALTHY, HostStatus.OFFLINE),
        # Cordoned, draining or in maintenance: the engine places nothing new there.
        cordoned=host.status in HELD_STATUSES,
        runtime=host.runtime,
        name=host.name,
        labels=tuple(sorted((str(k), str(v)) for k, v in (host.labels or {}).items())),
        process_runtime=host.process_runtime,
        reserved_for=tuple(reserved_for),
    )


def _gpu_state(
    gpu: Gpu, parts: list[Partition], allocations: dict[int, list[Allocation]]
) -> GpuState:
    product = converters.product_of(gpu)
    whole = next((p for p in parts if p.kind == PartitionKind.GPU), None)
    whole_allocations = allocations.get(whole.pk, []) if whole is not None else []
    mps_clients = (
        [a for a in whole_allocations if a.kind == RequestKind.MPS]
        if gpu.mode == SharingMode.MPS
        else []
    )
    return GpuState(
        id=gpu.pk,
        host_id=gpu.host_id,
        product_key=gpu.product_key or None,
        memory_mib=gpu.memory_mib,
        mode=gpu.mode,  # type: ignore[arg-type]
        healthy=gpu.health not in (GpuHealth.UNHEALTHY, GpuHealth.LOST),
        cordoned=gpu.cordoned,
        taken=gpu.mode == SharingMode.DEDICATED and (whole is None or bool(whole_allocations)),
        partitions=tuple(
            _mig_partition(p, allocations.get(p.pk, []), product)
            for p in parts
            if p.kind == PartitionKind.MIG
        ),
        mps_reservations=tuple(MpsRequest(a.memory_mib, a.compute_percent) for a in mps_clients),
        mps_reservation_ids=tuple(a.pk for a in mps_clients),
        mps_max_clients=whole.mps_max_clients if whole is not None else None,
        product=product,
        whole_partition_id=whole.pk if whole is not None else None,
        mps_policy=converters.mps_policy(whole)
        if whole is not None and whole.mps_enabled
        else None,
    )


def _mig_partition(
    partition: Partition, placed: list[Allocation], product: Product | None
) -> MigPartition:
    mps = None
    if partition.mps_enabled:
        clients = [a for a in placed if a.kind == RequestKind.MPS]
        mps = MpsShare(
            converters.mps_device(partition, product),
            converters.mps_policy(partition),
            tuple(MpsRequest(a.memory_mib, a.compute_percent) for a in clients),
            tuple(a.pk for a in clients),
            blocked=len(clients) < len(placed),
        )
    return MigPartition(
        partition.pk,
        int(partition.profile_id or 0),
        partition.start,
        occupied=bool(placed),
        allocation_id=placed[0].pk if placed else None,
        mps=mps,
    )


def placement_request(deployment: Deployment) -> PlacementRequest:
    if deployment.kind == RequestKind.MIG:
        return MigRequest(deployment.profile)
    if deployment.kind == RequestKind.MPS:
        return MpsRequest(int(deployment.memory_mib or 0), deployment.max_compute_percent)
    return WholeGpuRequest(int(deployment.gpu_count or 1))


def placement_demands(deployments: Iterable[Deployment]) -> dict[int, Demand]:
    """:func:`placement_demand` of many deployments: one query for the hosts that the copies of
    all those with a port hold (the tray asks for every deployment at once)."""
    rows = list(deployments)
    # Only a container that declares a port may bind it in the host's network: only its team's
    # policy is read (no query when there is none, as in most fleets).
    binding = {
        d.team_id for d in rows if runtime_of(d) == "container" and workload_port(d.workload)
    }
    policies = (
        dict(Team.objects.filter(pk__in=binding).values_list("pk", "policy")) if binding else {}
    )
    ports = {
        d.pk: host_network_port(d, policies.get(d.team_id)) if d.team_id in binding else 0
        for d in rows
    }
    ported = [pk for pk, port in ports.items() if port]
    held: dict[int, set[int]] = {pk: set() for pk in ported}
    if ported:
        copies = (
            Allocation.objects.filter(deployment_id__in=ported)
            .exclude(state=AllocationState.RELEASING)
            .values_list("deployment_id", "gpu__host_id")
            .distinct()
        )
        for deployment_id, host_id in copies:
            held[deployment_id].add(host_id)
    return {d.pk: placement_demand(d, held=held.get(d.pk), port=ports[d.pk]) for d in rows}


def placement_demand(
    deployment: Deployment, *, held: set[int] | None = None, port: int | None = None
) -> Demand:
    """What the deployment's replicas need beside their GPU share: a host whose agent runs
    their workload (``RUNS_ON``; a process: an agent started with --allow-process-runtime),
    that carries the labels it requires (``host_labels``) and that is not reserved for other
    teams than its own (``team``). Runtime ``none`` asks only for the labels and the team."""
    runtime = runtime_of(deployment)
    runs_on = RUNS_ON.get(runtime)
    labels = tuple(sorted((str(k), str(v)) for k, v in (deployment.host_labels or {}).items()))
    if runs_on is None or runs_on == RUNS_ON["none"]:
        return Demand(host_labels=labels, team=deployment.team_id)
    if port is None:
        port = host_network_port(deployment, deployment.team.policy)
    avoid: frozenset[int] = frozenset()
    if port:
        # Containers in the host's network bind their declared ports there: one copy per
        # host, a move's new copy included (the old one runs until the new one does). A copy
        # that is stopping frees the port in seconds: the agent retries the new one's start
        # meanwhile. Other replicas get host ports of their own from their agent, so copies
        # may share a host. ``held``: read already.
        avoid = frozenset(
            held
            if held is not None
            else Allocation.objects.filter(deployment=deployment)
            .exclude(state=AllocationState.RELEASING)
            .values_list("gpu__host_id", flat=True)
            .distinct()
        )
    return Demand(
        runtimes=tuple(sorted(runs_on)),
        workload=runtime,
        # A process runs on the host itself: only where the host's operator allowed it.
        process_runtime=runtime == "process",
        host_labels=labels,
        team=deployment.team_id,
        port=port,
        avoid_hosts=avoid,
    )


def workload_port(workload: Any) -> int:
    """The first port a workload declares (its health check's port counts), or 0."""
    if not isinstance(workload, dict):
        return 0
    ports = workload.get("ports")
    if not isinstance(ports, list) or not all(
        isinstance(p, dict) and isinstance(p.get("port"), int) for p in ports
    ):
        workload = {**workload, "ports": []}
    declared = declared_ports(workload)
    return declared[0]["port"] if declared else 0


def host_network_port(deployment: Deployment, policy: Any) -> int:
    """The port its replicas bind in their host's network, or 0: only containers whose team's
    policy gives them the host's network (``host_network``) bind their declared ports there;
    the others are published on, or listen on, host ports of their own."""
    if runtime_of(deployment) != "container" or not effective_policy(policy)["host_network"]:
        return 0
    return workload_port(deployment.workload)


def request_mix() -> RequestMix:
    """The fleet's request mix, learned from the deployments it runs: each deployment's request
    shape weighted by its replicas (one aggregate query). The engine reuses the scorer it
    compiled for an equal mix, so its memo stays warm from one ranking to the next."""
    rows = (
        Deployment.objects.values(
            "kind", "profile", "memory_mib", "max_compute_percent", "gpu_count"
        )
        .annotate(replicas=Sum("replicas"))
        .order_by()
    )
    counts: dict[RequestShape, float] = {}
    for row in rows:
        replicas = float(row.pop("replicas") or 0)
        shape = shape_of(placement_request(Deployment(**row)))
        counts[shape] = counts.get(shape, 0.0) + replicas
    return RequestMix.from_counts(counts)
