"""Read: the layout advisor's proposal for one GPU product (``GET /capacity/advice``).

The product's schedulable GPUs (healthy, not cordoned, on a ready host; in MIG mode, or idle in
another mode) and the deployments' waiting replicas (MIG profiles the product has, and MPS
shares, which run in new MIG instances with their own daemon) go to
:func:`fleet.placement.advisor.solver.advise`. The answer is a rollout proposal: the exact body for
``POST /rollouts/`` (a layout per GPU that changes, and the deployments whose waiting replicas
the engine places once every GPU is reshaped), with what it would place and move, and the
solver's objective, bound, gap, status and time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, TypedDict

from django.db.models import Count

from fleet.allocations.models import Allocation, Deployment, RequestKind
from fleet.allocations.quotas import quota_refusals
from fleet.allocations.selectors import fleet_snapshot, placement_demand, placement_demands
from fleet.core.errors import ServiceError
from fleet.inventory.models import Gpu
from fleet.mig import Product, product_by_key
from fleet.mps import MpsPolicy
from fleet.partitioning.selectors import current_layout
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec
from fleet.placement.advisor.groups import advise_groups
from fleet.placement.advisor.values import (
    DEFAULT_TIME_LIMIT_S,
    Advice,
    AdvisorGpu,
    ExistingInstance,
    GpuAdvice,
    WaitingGroup,
    WaitingMig,
    WaitingMps,
)
from fleet.placement.rules import demand_problems
from fleet.placement.snapshot import FleetSnapshot, GpuState, HostState

MAX_TIME_LIMIT_S = 10.0


class SolverPayload(TypedDict):
    status: str
    objective: int
    bound: int
    gap_percent: float
    time_s: float
    weights: dict[str, int]


class WaitingPayload(TypedDict):
    deployment_id: int
    deployment: str
    request: str
    waiting: int
    placed: int


class PlacePayload(TypedDict):
    profile: str
    start: int
    serves: str
    replicas: int
    mps: bool


class InstancePayload(TypedDict):
    profile: str
    start: int
    mps: bool


class GpuPayload(TypedDict):
    gpu: int
    name: str
    drained: bool
    moved_replicas: int
    layout: dict[str, Any]
    instances: list[InstancePayload]
    places: list[PlacePayload]


class AdvicePayload(TypedDict):
    product: str
    product_key: str
    schedulable_gpus: int
    waiting_replicas: int
    placed_replicas: int
    moved_replicas: int
    waiting: list[WaitingPayload]
    gpus: list[GpuPayload]
    solver: SolverPayload
    rollout: dict[str, Any] | None


def _product(ref: str) -> tuple[Product, list[Gpu]]:
    gpus = list(
        Gpu.objects.filter(product_key=ref).select_related("host")
        | Gpu.objects.filter(product_name=ref).select_related("host")
    )
    product = product_by_key(gpus[0].product_key) if gpus and gpus[0].product_key else None
    if product is None:
        product = product_by_key(ref)
    if product is None or not gpus:
        raise ServiceError(
            "advice.unknown_product",
            f"No GPU of product {ref!r} in the fleet (give an NVML name or catalog key).",
            {"product": ref},
        )
    if not product.mig_capable:
        raise ServiceError(
            "advice.not_mig",
            f"{product.name} has no MIG: there is no layout to advise.",
            {"product": product.key},
        )
    return product, gpus


def _schedulable(gpu: GpuState, host: HostState | None) -> bool:
    if host is None or not host.healthy or host.cordoned or not gpu.healthy or gpu.cordoned:
        return False
    if gpu.mode == "mig":
        return True
    return not gpu.taken and not gpu.mps_reservations  # idle: the operator's to reshape


def _advisor_gpu(
    gpu: GpuState, product: Product, movable_to: frozenset[int] | None = None
) -> AdvisorGpu:
    if gpu.mode != "mig":
        return AdvisorGpu(gpu.id, gpu.product or product)
    instances = []
    for partition in gpu.partitions:
        replicas = (
            len(partition.mps.reservations)
            if partition.mps is not None and not partition.mps.blocked
            else int(partition.occupied)
        )
        instances.append(
            ExistingInstance(
                partition.profile_id, partition.start, replicas, partition.mps is not None
            )
        )
    return AdvisorGpu(gpu.id, gpu.product or product, tuple(instances), movable_to=movable_to)


def _waiting(
    product: Product,
) -> tuple[list[Deployment], list[tuple[Deployment, WaitingMig | WaitingMps]]]:
    """The deployments with replicas to place (MIG ones of a profile the product has, MPS ones
    with a memory request), each with what waits of it."""
    placed = _placed_counts()
    deployments, items = [], []
    short = [
        d
        for d in Deployment.objects.filter(deleting=False).order_by("name")
        if d.replicas > placed.get(d.pk, 0)
    ]
    # A replica its team's quota refuses waits for the quota, not for a layout: a proposal
    # must not count it as placed.
    refused = quota_refusals(short)
    for deployment in short:
        missing = deployment.replicas - placed.get(deployment.pk, 0)
        if deployment.pk in refused:
            continue
        key = str(deployment.pk)
        item: WaitingMig | WaitingMps
        if deployment.kind == RequestKind.MIG:
            profile = product.profile(deployment.profile)
            if profile is None:
                continue
            item = WaitingMig(key, profile.id, missing)
        elif deployment.kind == RequestKind.MPS and deployment.memory_mib:
            compute = deployment.max_compute_percent
            item = WaitingMps(key, int(deployment.memory_mib), missing, compute)
        else:
            continue
        deployments.append(deployment)
        items.append((deployment, item))
    return deployments, items


def _groups(
    snapshot: FleetSnapshot,
    states: list[GpuState],
    items: list[tuple[Deployment, WaitingMig | WaitingMps]],
) -> list[WaitingGroup]:
    """The waiting replicas by the GPUs they may use: those whose host takes the deployment's
    demand (its labels, runtime, a port not held there, CPU and memory), as placement checks."""
    by_gpus: dict[frozenset[int], tuple[list[WaitingMig], list[WaitingMps]]] = {}
    for deployment, item in items:
        demand = placement_demand(deployment)
        allowed = frozenset(
            g.id for g in states if not demand_problems(snapshot.host(g.host_id), g, demand)
        )
        mig, mps = by_gpus.setdefault(allowed, ([], []))
        if isinstance(item, WaitingMig):
            mig.append(item)
        else:
            mps.append(item)
    return [WaitingGroup(ids, tuple(mig), tuple(mps)) for ids, (mig, mps) in by_gpus.items()]


def _movable_to(snapshot: FleetSnapshot, states: list[GpuState]) -> dict[int, frozenset[int]]:
    """Per GPU whose running replicas belong to deployments that constrain their host (labels,
    runtime, a port, CPU and memory): the other GPUs every one of them may move to, as a move's
    new copy is checked. A GPU missing here: its replicas may go anywhere."""
    running = (
        Allocation.objects.placed()
        .filter(gpu_id__in=[g.id for g in states])
        .values_list("gpu_id", "deployment_id")
        .distinct()
    )
    on_gpu: dict[int, set[int]] = {}
    for gpu_id, deployment_id in running:
        on_gpu.setdefault(gpu_id, set()).add(deployment_id)
    wanted = {pk for pks in on_gpu.values() for pk in pks}
    demands = placement_demands(Deployment.objects.filter(pk__in=wanted))
    allowed = {
        pk: frozenset(
            g.id for g in states if not demand_problems(snapshot.host(g.host_id), g, demand)
        )
        for pk, demand in demands.items()
        if demand is not None
    }
    out: dict[int, frozenset[int]] = {}
    for gpu_id, deployments in on_gpu.items():
        limits = [allowed[pk] for pk in deployments if pk in allowed]
        if limits:
            out[gpu_id] = frozenset.intersection(*limits) - {gpu_id}
    return out


def waiting_replica_count() -> int:
    """Replicas of live deployments that have no place yet (what the advisor may help)."""
    placed = _placed_counts()
    return sum(
        max(0, replicas - placed.get(pk, 0))
        for pk, replicas in Deployment.objects.filter(deleting=False).values_list("pk", "replicas")
    )


def _placed_counts() -> dict[int, int]:
    return dict(
        Allocation.objects.placed()
        .values("deployment")
        .annotate(n=Count("replica", distinct=True))
        .values_list("deployment", "n")
    )


def capacity_advice(*, product: str, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> AdvicePayload:
    """The advisor's proposal for ``product`` (an NVML name or a catalog key).

    Raises:
        ServiceError: ``advice.unknown_product`` (no GPU of it in the fleet),
            ``advice.not_mig`` (the product has no MIG).
    """
    found, rows = _product(product)
    snapshot = fleet_snapshot()
    ids = {row.pk for row in rows}
    states = [g for g in snapshot.gpus if g.id in ids and _schedulable(g, snapshot.host(g.host_id))]
    deployments, items = _waiting(found)
    movable = _movable_to(snapshot, states)
    gpus = [_advisor_gpu(g, found, movable.get(g.id)) for g in states]
    advice = advise_groups(
        gpus,
        _groups(snapshot, states, items) or [WaitingGroup(frozenset(g.id for g in gpus))],
        time_limit_s=min(time_limit_s, MAX_TIME_LIMIT_S),
        clock=time.monotonic,
    )
    by_id = {row.pk: row for row in rows}
    names = {str(d.pk): d.name for d in deployments}
    changed = [g for g in advice.gpus if g.changed]
    layouts = {g.gpu_id: _layout(by_id[g.gpu_id], g, found) for g in changed}
    return AdvicePayload(
        product=found.name,
        product_key=found.key,
        schedulable_gpus=len(gpus),
        waiting_replicas=sum(advice.waiting.values()),
        placed_replicas=advice.placed_total,
        moved_replicas=advice.moved_replicas,
        waiting=[_waiting_row(d, advice) for d in deployments],
        gpus=[_gpu_row(by_id[g.gpu_id], g, layouts[g.gpu_id], found, names) for g in changed],
        solver=SolverPayload(
            status=advice.status,
            objective=advice.objective,
            bound=advice.bound,
            gap_percent=advice.gap_percent,
            time_s=advice.time_s,
            weights=advice.weights,
        ),
        rollout=_rollout(layouts, [d.pk for d in deployments if advice.placed.get(str(d.pk))]),
    )


def _waiting_row(deployment: Deployment, advice: Advice) -> WaitingPayload:
    if deployment.kind == RequestKind.MIG:
        request = deployment.profile
    else:
        request = f"MPS {deployment.memory_mib} MiB"
    key = str(deployment.pk)
    return WaitingPayload(
        deployment_id=deployment.pk,
        deployment=deployment.name,
        request=request,
        waiting=advice.waiting.get(key, 0),
        placed=advice.placed.get(key, 0),
    )


def _layout(gpu: Gpu, proposal: GpuAdvice, product: Product) -> LayoutSpec:
    """The proposal as a layout: kept instances keep their MPS policy; a new MPS instance gets
    the default policy."""
    now = (
        {
            (p.id, i.start): i.mps
            for i in current_layout(gpu).instances
            if (p := product.profile(i.profile)) is not None
        }
        if gpu.mode == "mig"
        else {}
    )
    instances = []
    for instance in proposal.instances:
        policy: MpsPolicy | None = None
        if instance.mps:
            policy = now.get((instance.profile_id, instance.start)) or MpsPolicy()
        instances.append(MigInstanceSpec(instance.profile_id, instance.start, policy))
    return LayoutSpec(mode="mig", instances=tuple(instances))


def _gpu_row(
    gpu: Gpu, proposal: GpuAdvice, layout: LayoutSpec, product: Product, names: dict[str, str]
) -> GpuPayload:
    places = []
    shown = []
    for instance in proposal.instances:
        profile = product.profile(instance.profile_id)
        label = profile.name if profile else str(instance.profile_id)
        shown.append(InstancePayload(profile=label, start=instance.start, mps=instance.mps))
        if not instance.serves:
            continue
        serves = names.get(instance.serves, instance.serves)
        places.append(
            PlacePayload(
                profile=label,
                start=instance.start,
                serves=serves,
                replicas=instance.replicas,
                mps=instance.mps,
            )
        )
    return GpuPayload(
        gpu=gpu.pk,
        name=str(gpu),
        drained=proposal.drained,
        moved_replicas=proposal.moved_replicas,
        layout=layout.as_json(),
        instances=shown,
        places=places,
    )


def _rollout(layouts: dict[int, LayoutSpec], place: Sequence[int]) -> dict[str, Any] | None:
    if not layouts:
        return None
    return {
        "selector": {"gpus": sorted(layouts)},
        "layouts": [
            {"gpu": gpu_id, "layout": layouts[gpu_id].as_json()} for gpu_id in sorted(layouts)
        ],
        "max_unavailable": 1,
        "place_waiting": list(place),
    }
