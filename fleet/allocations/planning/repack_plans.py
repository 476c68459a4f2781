"""The plans a defrag and a repack carry out, as the API, the capacity page and the workflows
(:mod:`fleet.workflows.defrag`, :mod:`fleet.workflows.repack`) read them.

:func:`capacity_repack_plan` asks the pure planner
(:func:`fleet.placement.repack.solver.plan_repack`: CP-SAT, the greedy plan as fallback) with
what the database knows beside the snapshot: each replica's demand (host runtime, labels) and
the GPUs it cannot empty (a replica spanning several GPUs, a move in progress).
:func:`step_of` turns one planned move into the step a workflow runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from fleet.allocations.models import Allocation, RequestKind
from fleet.allocations.selectors import fleet_snapshot, placement_demand, placement_request
from fleet.inventory.models import Gpu
from fleet.placement import Demand, Move, PlacementRequest
from fleet.placement.repack.solver import plan_repack
from fleet.placement.repack.values import DEFAULT_TIME_LIMIT_S, RepackPlan, ReplicaKey


def _placed_in(partition_id: int) -> int | None:
    """The replica placed in a partition (the planner names MIG and whole-GPU replicas by the
    partition they hold)."""
    found = Allocation.objects.placed().filter(partition_id=partition_id)
    return found.values_list("pk", flat=True).first()


def step_of(move: Move) -> dict[str, Any]:
    if not move.occupied:
        return {"kind": "destroy_idle", "partition": move.allocation_id, "gpu": move.from_gpu}
    if move.kind == "gpu":  # a whole-GPU replica: its partition is the whole GPU
        return {
            "kind": "move",
            "allocation": _placed_in(move.allocation_id),
            "from_partition": move.allocation_id,
            "partition": None,
            "gpu": move.to_gpu,
            "start": None,
            "destroy_source": False,
        }
    if move.kind == "mig":
        return {
            "kind": "move",
            "allocation": _placed_in(move.allocation_id),
            "from_partition": move.allocation_id,
            "partition": move.to_partition_id,
            "gpu": move.to_gpu if move.to_partition_id is None else None,
            "start": move.new_instance.start if move.new_instance else None,
            "destroy_source": True,
        }
    return {
        "kind": "move",
        "allocation": move.allocation_id,
        "from_partition": None,
        "partition": move.to_partition_id,
        "gpu": move.to_gpu if move.to_partition_id is None else None,
        "start": None,
        "destroy_source": False,
    }


def repack_time_limit_s() -> float:
    """CP-SAT's time limit (``FLEET_REPACK_TIME_LIMIT_SECONDS``, 3 s by default)."""
    return float(getattr(settings, "FLEET_REPACK_TIME_LIMIT_SECONDS", DEFAULT_TIME_LIMIT_S))


@dataclass(frozen=True)
class _Replicas:
    demands: dict[ReplicaKey, Demand]
    requests: dict[ReplicaKey, PlacementRequest]
    pinned: dict[int, str]


def _replicas() -> _Replicas:
    """Each placed replica's demand and request by its plan key, and the GPUs that must stay as
    they are."""
    demands: dict[ReplicaKey, Demand] = {}
    requests: dict[ReplicaKey, PlacementRequest] = {}
    pinned: dict[int, str] = {}
    by_deployment: dict[int, Demand | None] = {}
    rows = Allocation.objects.placed().select_related("deployment").order_by("pk")
    for allocation in rows:
        deployment = allocation.deployment
        if deployment.pk not in by_deployment:
            by_deployment[deployment.pk] = placement_demand(deployment)
        name = f"{deployment.name}[{allocation.replica}]"
        if allocation.replaces_id is not None:
            pinned[allocation.gpu_id] = f"a move of {name} onto it is in progress"
        if deployment.kind == RequestKind.GPU and (deployment.gpu_count or 1) > 1:
            pinned[allocation.gpu_id] = (
                f"runs {name}, which spans {deployment.gpu_count} GPUs (not moved)"
            )
        key = _key(allocation, deployment.kind)
        requests[key] = placement_request(deployment)
        demand = by_deployment[deployment.pk]
        if demand is not None:
            demands[key] = demand
    moving = Allocation.objects.placed().filter(replaces__isnull=False).values("replaces_id")
    for gpu_id in Allocation.objects.filter(pk__in=moving).values_list("gpu_id", flat=True):
        pinned[gpu_id] = "one of its replicas is moving"
    return _Replicas(demands, requests, pinned)


def _key(allocation: Allocation, kind: str) -> ReplicaKey:
    if kind == RequestKind.MPS:
        return ("mps", allocation.pk)
    return ("gpu" if kind == RequestKind.GPU else "mig", allocation.partition_id)


def capacity_repack_plan(
    *, product_key: str, count: int, time_limit_s: float | None = None
) -> RepackPlan:
    """The proposal: moves that empty ``count`` GPUs of ``product_key``, fewest replicas moved
    (changes nothing)."""
    replicas = _replicas()
    return plan_repack(
        fleet_snapshot(),
        product_key,
        count,
        demands=replicas.demands,
        requests=replicas.requests,
        pinned=replicas.pinned,
        time_limit_s=repack_time_limit_s() if time_limit_s is None else time_limit_s,
    )


def fleet_products() -> dict[str, str]:
    """The fleet's GPU products: catalog key to name."""
    rows = Gpu.objects.exclude(product_key="").order_by().values_list("product_key", "product_name")
    return {key: name or key for key, name in rows.distinct()}


def repack_payload(plan: RepackPlan, time_limit_s: float | None = None) -> dict[str, Any]:
    """The plan as the API and the capacity page show it: GPUs by host and index, each moved
    replica by its deployment."""
    gpu_ids = {m.from_gpu for m in plan.moves} | {m.to_gpu for m in plan.moves if m.to_gpu}
    gpu_ids |= set(plan.freed) | {g for g, _ in plan.unmovable}
    gpus = {
        g.pk: {"gpu": g.pk, "host": g.host.name, "index": g.index, "uuid": g.uuid}
        for g in Gpu.objects.filter(pk__in=gpu_ids).select_related("host")
    }
    labels = {pk: f"{g['host']}/gpu{g['index']}" for pk, g in gpus.items()}
    return {
        "product": fleet_products().get(plan.product_key, plan.product_key),
        "product_key": plan.product_key,
        "free_gpus": plan.asked,
        "feasible": plan.feasible,
        "reason": plan.reason,
        "method": plan.method,
        "status": plan.status,
        "cost": plan.cost,
        "bound": plan.bound,
        "time_limit_s": repack_time_limit_s() if time_limit_s is None else time_limit_s,
        "already_free": plan.already_free,
        "freed": [gpus[g] for g in plan.freed if g in gpus],
        "unmovable": [{**gpus[g], "reason": why} for g, why in plan.unmovable if g in gpus],
        "moves": _moves(plan, labels),
    }


def _moves(plan: RepackPlan, labels: dict[int, str]) -> list[dict[str, Any]]:
    steps = [step_of(m) for m in plan.moves]
    ids = [s["allocation"] for s in steps if s["kind"] == "move" and s["allocation"]]
    rows = {a.pk: a for a in Allocation.objects.filter(pk__in=ids).select_related("deployment")}
    moves = []
    for move, step in zip(plan.moves, steps, strict=True):
        allocation = rows.get(step.get("allocation") or 0)
        instance = move.new_instance
        moves.append(
            {
                "kind": move.kind,
                "allocation": allocation.pk if allocation else None,
                "deployment": allocation.deployment.name if allocation else None,
                "replica": allocation.replica if allocation else None,
                "from_gpu": move.from_gpu,
                "from_label": labels.get(move.from_gpu, str(move.from_gpu)),
                "to_gpu": move.to_gpu,
                "to_label": labels.get(move.to_gpu) if move.to_gpu else None,
                "to_partition": move.to_partition_id,
                "new_instance": {"profile_id": instance.profile_id, "start": instance.start}
                if instance
                else None,
            }
        )
    return moves
