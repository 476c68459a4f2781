"""Repack (free whole GPUs) on generated fleets: CP-SAT's plan against its proven bound and
against the greedy plan (``manage.py bench_placement --repack``).

A fleet is hosts of 8 GPUs, three in four H100 and the rest A100 80GB (MIG profiles of the same
names), each GPU in MIG mode (half: a random maximal layout with some instances kept, most of
them busy), MPS mode (a third: up to four clients) or dedicated (the rest: a third of them
taken); a ``dense`` fleet keeps more instances and up to six clients. For each fleet and
count, :func:`fleet.placement.repack.solver.plan_repack` is asked to empty that many H100s, once
with CP-SAT and once greedy (``use_solver=False``): cost (replicas moved), bound, status and wall
time. The clock is passed in (the package reads none).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from fleet.mig import maximal_layouts, product_by_key
from fleet.mps import MpsRequest
from fleet.placement.repack.solver import plan_repack
from fleet.placement.snapshot import FleetSnapshot, GpuState, HostState, MigPartition

GPUS_PER_HOST = 8
EMPTIED = "h100-sxm5-80gb"
OTHER = "a100-sxm4-80gb"
PROFILE_IDS = [19, 14, 9, 5, 0]  # 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb
CLIENT_MIB = (5_000, 10_000, 20_000)


DENSITY = {"sparse": (0.45, 4), "dense": (0.75, 6)}
"""Per fleet kind: the share of a maximal MIG layout's instances kept, the most MPS clients."""


def generated_fleet(gpu_count: int, seed: int, kind: str = "sparse") -> FleetSnapshot:
    """A fleet of ``gpu_count`` GPUs (rounded up to whole hosts), the same for the same seed."""
    rng = random.Random(seed)
    keep, clients = DENSITY[kind]
    hosts = tuple(HostState(h) for h in range(1, -(-gpu_count // GPUS_PER_HOST) + 1))
    gpus = [
        _gpu(rng, k + 1, hosts[k // GPUS_PER_HOST].id, keep, clients)
        for k in range(len(hosts) * GPUS_PER_HOST)
    ]
    return FleetSnapshot(hosts, tuple(gpus))


def _gpu(rng: random.Random, gpu_id: int, host_id: int, keep: float, clients: int) -> GpuState:
    key = EMPTIED if rng.random() < 0.75 else OTHER
    product = product_by_key(key)
    assert product is not None
    memory = product.memory_mib
    roll = rng.random()
    if roll < 0.5:
        layout = rng.choice(maximal_layouts(product, PROFILE_IDS))
        kept = [i for i in layout if rng.random() < keep]
        partitions = tuple(
            MigPartition(gpu_id * 10 + k, i.profile_id, i.start, rng.random() < 0.75)
            for k, i in enumerate(kept)
        )
        return GpuState(gpu_id, host_id, key, memory, "mig", partitions=partitions)
    if roll < 0.8:
        placed: list[MpsRequest] = []
        for _ in range(rng.randint(0, clients)):
            mib = rng.choice(CLIENT_MIB)
            if sum(c.memory_mib for c in placed) + mib <= memory:
                placed.append(MpsRequest(mib))
        return GpuState(
            gpu_id,
            host_id,
            key,
            memory,
            "mps",
            mps_reservations=tuple(placed),
            mps_reservation_ids=tuple(gpu_id * 10 + k for k in range(len(placed))),
            whole_partition_id=gpu_id * 1000,
        )
    taken = rng.random() < 1 / 3
    return GpuState(
        gpu_id, host_id, key, memory, "dedicated", taken=taken, whole_partition_id=gpu_id * 1000
    )


def repack_free(
    clock: Callable[[], float],
    *,
    gpu_counts: Sequence[int],
    free_counts: Sequence[int],
    seeds: Sequence[int],
    time_limit_s: float,
) -> dict[str, Any]:
    """Every fleet size, count and seed: CP-SAT's plan, its bound, and the greedy plan."""
    runs = []
    for kind in DENSITY:
        for gpu_count in gpu_counts:
            for seed in seeds:
                snapshot = generated_fleet(gpu_count, seed, kind)
                for count in free_counts:
                    run = _run(clock, snapshot, gpu_count, seed, count, time_limit_s)
                    runs.append({"fleet": kind, **run})
    return {
        "benchmark": "repack_free",
        "product": EMPTIED,
        "time_limit_s": time_limit_s,
        "runs": runs,
        "summary": _summary(runs),
    }


def _run(
    clock: Callable[[], float],
    snapshot: FleetSnapshot,
    gpu_count: int,
    seed: int,
    count: int,
    time_limit_s: float,
) -> dict[str, Any]:
    started = clock()
    solved = plan_repack(snapshot, EMPTIED, count, time_limit_s=time_limit_s)
    solved_s = clock() - started
    started = clock()
    greedy = plan_repack(snapshot, EMPTIED, count, use_solver=False)
    greedy_s = clock() - started
    return {
        "gpus": gpu_count,
        "seed": seed,
        "free_gpus": count,
        "candidates": gpu_count - len(solved.unmovable) - solved.already_free,
        "cp_sat": {
            "feasible": solved.feasible,
            "method": solved.method,
            "status": solved.status,
            "cost": solved.cost,
            "bound": solved.bound,
            "seconds": round(solved_s, 3),
        },
        "greedy": {
            "feasible": greedy.feasible,
            "cost": greedy.cost,
            "seconds": round(greedy_s, 3),
        },
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    both = [r for r in runs if r["cp_sat"]["feasible"] and r["greedy"]["feasible"]]
    return {
        "runs": len(runs),
        "cp_sat_feasible": sum(r["cp_sat"]["feasible"] for r in runs),
        "greedy_feasible": sum(r["greedy"]["feasible"] for r in runs),
        "cp_sat_optimal": sum(r["cp_sat"]["status"] == "optimal" for r in runs),
        "cp_sat_at_bound": sum(
            r["cp_sat"]["feasible"] and r["cp_sat"]["cost"] == r["cp_sat"]["bound"] for r in runs
        ),
        "both_feasible": len(both),
        "cp_sat_cost_total": sum(r["cp_sat"]["cost"] for r in both),
        "greedy_cost_total": sum(r["greedy"]["cost"] for r in both),
        "cp_sat_strictly_cheaper": sum(r["cp_sat"]["cost"] < r["greedy"]["cost"] for r in both),
        "cp_sat_seconds_max": max((r["cp_sat"]["seconds"] for r in runs), default=0.0),
    }
