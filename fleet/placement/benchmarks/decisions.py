"""Decision time of :func:`fleet.placement.rank` on a synthetic fleet (1,000 GPUs by default).

The fleet mixes what the product runs: H100 and A100 GPUs in MIG mode (random valid layouts,
some instances busy, some running MPS), whole GPUs in MPS mode with clients and policies, and
dedicated GPUs (half of them taken), with a few cordoned or unhealthy. Requests are drawn from a
mix of MIG profiles, MPS shares and whole-GPU counts, and the strategy gets the mix learned from
them, as the product's selector would.

Two regimes, each over the same request stream:

* ``live``: one snapshot that evolves, each decision's target applied to it (as auto-placement
  places replicas one after another, and as the trace replay does), so what is memoised on the
  unchanged GPUs and hosts carries over;
* ``cold``: every call gets a fresh copy of the snapshot (new frozen states, nothing memoised on
  them survives), as the product builds one from the database for every ranking.

``best`` times ``rank(...).best`` (what auto-placement reads); ``lists`` adds the full feasible
and infeasible lists (what the targets preview reads). The scorer of the mix is shared by both, as
the product shares it between rankings while the mix does not change; the first
:data:`WARMUP` decisions of each regime are not timed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypedDict

from fleet.mig import Product, maximal_layouts, product_by_key
from fleet.mps import MpsDevice, MpsPolicy, MpsRequest
from fleet.placement.benchmarks.replay import percentile
from fleet.placement.fit import Strategy, rank
from fleet.placement.mix import RequestMix
from fleet.placement.simulate import apply_target
from fleet.placement.snapshot import (
    FleetSnapshot,
    GpuState,
    HostState,
    MigPartition,
    MigRequest,
    MpsShare,
    PlacementRequest,
    WholeGpuRequest,
)

GPUS_PER_HOST = 8
PRODUCT_KEYS = ("h100-sxm5-80gb", "a100-sxm4-40gb")
PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.5gb", "3g.20gb")
WARMUP = 50


class Timing(TypedDict):
    p50: float
    p99: float
    max: float


class DecisionReport(TypedDict):
    gpus: int
    hosts: int
    decisions: int
    strategy: str
    mix_shapes: int
    placed: int
    live_best_ms: Timing
    cold_best_ms: Timing
    cold_lists_ms: Timing


def _products() -> list[Product]:
    found = [product_by_key(key) for key in PRODUCT_KEYS]
    return [p for p in found if p is not None]


def synthetic_fleet(gpu_count: int, seed: int) -> FleetSnapshot:
    """A seeded fleet of ``gpu_count`` GPUs on hosts of :data:`GPUS_PER_HOST`."""
    rng = random.Random(seed)
    products = _products()
    layouts = {p.key: maximal_layouts(p) for p in products}
    hosts = tuple(HostState(h) for h in range((gpu_count + GPUS_PER_HOST - 1) // GPUS_PER_HOST))
    gpus: list[GpuState] = []
    next_id = iter(range(1, 10**9))
    for index in range(gpu_count):
        product = rng.choice(products)
        gpu = GpuState(index, index // GPUS_PER_HOST, product.key, product.memory_mib)
        kind = rng.random()
        if kind < 0.4:
            gpu = _mig_gpu(gpu, product, rng.choice(layouts[product.key]), rng, next_id)
        elif kind < 0.7:
            gpu = _mps_gpu(gpu, rng)
        else:
            gpu = replace(gpu, taken=rng.random() < 0.5, whole_partition_id=next(next_id))
        if rng.random() < 0.03:
            gpu = replace(gpu, cordoned=True)
        elif rng.random() < 0.02:
            gpu = replace(gpu, healthy=False)
        gpus.append(gpu)
    return FleetSnapshot(hosts, tuple(gpus))


def _mig_gpu(
    gpu: GpuState, product: Product, layout: Sequence[object], rng: random.Random, ids: object
) -> GpuState:
    partitions = []
    for instance in layout:
        if rng.random() < 0.25:
            continue  # free slices
        profile_id, start = instance.profile_id, instance.start  # type: ignore[attr-defined]
        mps = None
        profile = product.profile(profile_id)
        if profile is not None and rng.random() < 0.2:
            device = MpsDevice.mig_instance(
                profile.memory_mib, profile.compute_slices, product.compute_slice_count
            )
            clients = tuple(
                MpsRequest(rng.choice([1000, 2000, 4000])) for _ in range(rng.randint(0, 2))
            )
            mps = MpsShare(device, None, clients)
        partitions.append(
            MigPartition(
                next(ids),  # type: ignore[call-overload]
                profile_id,
                start,
                occupied=rng.random() < 0.7 or bool(mps and mps.reservations),
                mps=mps,
            )
        )
    return replace(gpu, mode="mig", partitions=tuple(partitions))


def _mps_gpu(gpu: GpuState, rng: random.Random) -> GpuState:
    policy = rng.choice([None, None, MpsPolicy(default_active_thread_percentage=50)])
    count = rng.randint(0, 6)
    reservations = tuple(MpsRequest(rng.choice([2000, 4000, 8000, 10000])) for _ in range(count))
    if sum(r.memory_mib for r in reservations) > gpu.memory_mib:
        reservations = reservations[:2]
    return replace(gpu, mode="mps", mps_reservations=reservations, mps_policy=policy)


def synthetic_requests(count: int, seed: int) -> list[PlacementRequest]:
    """A seeded stream of requests: MIG profiles, MPS shares and whole GPUs."""
    rng = random.Random(seed + 1)
    out: list[PlacementRequest] = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.4:
            out.append(MigRequest(rng.choice(PROFILES)))
        elif kind < 0.8:
            memory = rng.choice([1000, 2000, 4000, 8000, 12000, 20000])
            out.append(MpsRequest(memory, rng.choice([None, 20, 50])))
        else:
            out.append(WholeGpuRequest(rng.choice([1, 1, 2, 4, 8])))
    return out


def _fresh(snapshot: FleetSnapshot) -> FleetSnapshot:
    """A copy with new frozen states: nothing memoised on the old ones carries over."""
    return FleetSnapshot(
        tuple(replace(h) for h in snapshot.hosts), tuple(replace(g) for g in snapshot.gpus)
    )


def _timing(values: Sequence[float]) -> Timing:
    return Timing(
        p50=round(percentile(values, 50), 3),
        p99=round(percentile(values, 99), 3),
        max=round(max(values, default=0.0), 3),
    )


def decision_times(
    clock: Callable[[], float],
    *,
    gpu_count: int = 1000,
    decisions: int = 500,
    seed: int = 42,
    strategy: Strategy = "product",
) -> DecisionReport:
    """Time ``rank`` on ``decisions`` requests, live and cold, on a synthetic fleet."""
    base = synthetic_fleet(gpu_count, seed)
    requests = synthetic_requests(decisions + WARMUP, seed)
    mix = RequestMix.of((r, 1.0) for r in requests)
    live_ms: list[float] = []
    snapshot = base
    placed = 0
    for k, request in enumerate(requests):
        start = clock()
        best = rank(snapshot, request, strategy=strategy, mix=mix).best
        elapsed = (clock() - start) * 1000.0
        if k >= WARMUP:
            live_ms.append(elapsed)
        if best is not None:
            snapshot = apply_target(snapshot, request, best)
            placed += 1
    best_ms: list[float] = []
    lists_ms: list[float] = []
    for k, request in enumerate(requests):
        fresh = _fresh(base)
        start = clock()
        ranking = rank(fresh, request, strategy=strategy, mix=mix)
        _ = ranking.best
        middle = clock()
        _ = (ranking.feasible, ranking.infeasible)
        end = clock()
        if k >= WARMUP:
            best_ms.append((middle - start) * 1000.0)
            lists_ms.append((end - start) * 1000.0)
    return DecisionReport(
        gpus=gpu_count,
        hosts=len(base.hosts),
        decisions=decisions,
        strategy=strategy,
        mix_shapes=len(mix.shapes),
        placed=placed,
        live_best_ms=_timing(live_ms),
        cold_best_ms=_timing(best_ms),
        cold_lists_ms=_timing(lists_ms),
    )
