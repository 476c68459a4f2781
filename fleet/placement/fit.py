"""The one fit function: rank every target of a request on a fleet snapshot.

The API, the drag-and-drop preview, auto-placement and the planner all call :func:`rank`; the
place service asks :func:`check` for the one target it commits, on a snapshot read under its row
locks. Both run the same per-GPU rules (:mod:`fleet.placement.rules`), so the preview and the
commit give the same answer and the same refusal codes. Ties keep the snapshot's GPU order.

Semantics:
    * MPS (ECS): a client reserves ``memory_mib`` on an MPS daemon's device (a GPU in MPS mode,
      or a MIG instance running its own daemon); capacity is the sum of reservations, never live
      use; the compute cap is validated, not summed; the daemon's policy caps both.
    * MIG (SageMaker): one profile per replica; a free partition of that profile first, else a new
      instance in free slices of a MIG-mode GPU, never touching busy instances.
    * Whole GPU: ``count`` free dedicated GPUs on one host.
    * A :class:`Demand` (optional) adds host CPU and memory, where the snapshot's hosts carry
      them, the GPU products a replica may run on, and the host runtimes that run its workload
      (``placement.runtime``) and the labels its host must carry (``placement.host_labels``).

Strategies: ``product`` (the default: :mod:`fleet.placement.mixfit`, fragmentation against the
fleet's request mix, the policy the trace benchmark measures), ``fragmentation_aware`` (the
earlier heuristic), ``best_fit`` and ``first_fit``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from fleet.domain import Violation
from fleet.mps import MpsRequest
from fleet.placement import migfit, mixfit
from fleet.placement.mix import RequestMix
from fleet.placement.ranking import Ranking, Refusal, Target
from fleet.placement.rules import (
    blocked,
    eligibility,
    mode_mismatch,
    mps_fits,
    whole_problems,
)
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    MigRequest,
    MpsShare,
    PlacementRequest,
    WholeGpuRequest,
)

Strategy = Literal["product", "first_fit", "best_fit", "fragmentation_aware"]
STRATEGIES: tuple[Strategy, ...] = ("product", "first_fit", "best_fit", "fragmentation_aware")
DEFAULT_STRATEGY: Strategy = "product"
FREE_PARTITION_BONUS = mixfit.FREE_PARTITION_BONUS

__all__ = [
    "DEFAULT_STRATEGY",
    "FREE_PARTITION_BONUS",
    "STRATEGIES",
    "Ranking",
    "Refusal",
    "Strategy",
    "Target",
    "check",
    "eligibility",
    "gpu_options",
    "rank",
]


def rank(
    snapshot: FleetSnapshot,
    request: PlacementRequest,
    *,
    strategy: Strategy = DEFAULT_STRATEGY,
    mix: RequestMix | None = None,
    demand: Demand | None = None,
) -> Ranking:
    """Rank every target of ``request`` on ``snapshot``.

    Args:
        snapshot: the fleet as last observed.
        request: a :class:`MigRequest`, an MPS request or a :class:`WholeGpuRequest`.
        strategy: ``product`` (fragmentation against ``mix``: keeps room for the requests the
            fleet sees, large MIG profiles placeable and whole hosts for multi-GPU requests),
            ``first_fit`` (snapshot order), ``best_fit`` (least room left) or
            ``fragmentation_aware`` (the earlier heuristic).
        mix: the fleet's request mix (``product`` only); ``None``: a neutral default.
        demand: host CPU, memory, GPU products, host runtimes and labels the replica needs.

    Returns:
        The ranking; ``feasible`` is empty (and ``infeasible`` says why) when nothing fits.

    Raises:
        ValueError: for an unknown strategy.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")

    def refusals() -> tuple[Refusal, ...]:
        return _ranked(snapshot, request, "first_fit", demand).infeasible

    if strategy == "product":
        return mixfit.rank_product(snapshot, request, mix, demand, refusals)
    return _ranked(snapshot, request, strategy, demand)


def _ranked(
    snapshot: FleetSnapshot, request: PlacementRequest, strategy: Strategy, demand: Demand | None
) -> Ranking:
    feasible: list[Target] = []
    infeasible: list[Refusal] = []
    if isinstance(request, WholeGpuRequest):
        _rank_whole(snapshot, request, strategy, demand, feasible, infeasible)
    else:
        for gpu in snapshot.gpus:
            found, refused = gpu_options(snapshot, gpu, request, strategy, demand=demand)
            feasible.extend(found)
            infeasible.extend(refused)
    order = sorted(range(len(feasible)), key=lambda k: -feasible[k].score)
    return Ranking(tuple(feasible[k] for k in order), tuple(infeasible))


def gpu_options(
    snapshot: FleetSnapshot,
    gpu: GpuState,
    request: MigRequest | MpsRequest,
    strategy: Strategy = DEFAULT_STRATEGY,
    *,
    mix: RequestMix | None = None,
    demand: Demand | None = None,
) -> tuple[list[Target], list[Refusal]]:
    """Every target of a MIG or MPS request on one GPU, and why the others do not fit."""
    problems = blocked(snapshot, gpu, demand)
    if problems:
        return [], [Refusal(gpu.id, None, problems)]
    if isinstance(request, MigRequest):
        found, refused = _mig_gpu(gpu, request, strategy)
    else:
        found, refused = _mps_gpu(gpu, request, strategy)
    if strategy == "product" and found:
        found = mixfit.gpu_targets(snapshot, gpu, request, mix, demand)
    return found, refused


def check(
    snapshot: FleetSnapshot,
    request: PlacementRequest,
    *,
    gpu_id: int,
    partition_id: int | None = None,
    start: int | None = None,
    strategy: Strategy = DEFAULT_STRATEGY,
    mix: RequestMix | None = None,
    demand: Demand | None = None,
) -> Target | Refusal:
    """The verdict on one target: what the place service commits, by the rules :func:`rank`
    uses for the preview (so the two cannot disagree).

    Args:
        snapshot: the fleet as read under the place service's row locks.
        request: the replica to place.
        gpu_id: the GPU asked for.
        partition_id: a partition of it (a MIG instance, or one running MPS), if asked for.
        start: for a MIG request, the start slice of the instance to create (the engine's
            choice in a ranking's ``new_instance``).
        strategy: how to choose among this GPU's options when the caller did not.
        mix: the request mix, for the ``product`` strategy.
        demand: host CPU, memory, GPU products, host runtimes and labels the replica needs.

    Returns:
        The :class:`Target` to write, or the :class:`Refusal` saying why not.
    """
    gpu = snapshot.gpu(gpu_id)
    if gpu is None:
        unknown = Violation("placement.unknown_gpu", f"GPU {gpu_id} is not in the fleet.")
        return Refusal(gpu_id, partition_id, (unknown,))
    if isinstance(request, WholeGpuRequest):
        return _whole_on(snapshot, request, gpu, partition_id, demand)
    problems = blocked(snapshot, gpu, demand)
    if problems:
        return Refusal(gpu.id, partition_id, problems)
    if isinstance(request, MigRequest) and partition_id is None and start is not None:
        return _mig_at(gpu, request, start)
    found, refused = gpu_options(snapshot, gpu, request, strategy, mix=mix, demand=demand)
    mine = [t for t in found if partition_id in (None, t.partition_id)]
    if mine:
        return max(mine, key=lambda t: t.score)
    reasons = [r for r in refused if partition_id in (None, r.partition_id)]
    if reasons:
        return reasons[0]
    return Refusal(gpu.id, partition_id, (_not_a_target(gpu, request, partition_id),))


def _not_a_target(
    gpu: GpuState, request: MigRequest | MpsRequest, partition_id: int | None
) -> Violation:
    partition = next((p for p in gpu.partitions if p.id == partition_id), None)
    if partition is None:
        return Violation(
            "placement.partition_unavailable",
            f"Partition {partition_id} is not a target on GPU {gpu.id}.",
            {"partition": partition_id},
        )
    if isinstance(request, MigRequest):
        if partition.occupied:
            return Violation("placement.partition_busy", f"Partition {partition.id} is in use.")
        return Violation(
            "placement.profile_mismatch",
            f"Partition {partition.id} is not a {request.profile} instance.",
            {"profile_id": partition.profile_id},
        )
    return Violation(
        "placement.mode_mismatch",
        f"No MPS daemon runs in partition {partition.id}.",
        {"mode": gpu.mode, "wanted": "mps"},
    )


def _mps_gpu(
    gpu: GpuState, request: MpsRequest, strategy: Strategy
) -> tuple[list[Target], list[Refusal]]:
    fitting, refused = mps_fits(gpu, request)
    found: list[Target] = []
    for partition_id, share in fitting:
        free_after = (
            share.device.memory_mib
            - sum(r.memory_mib for r in share.reservations)
            - request.memory_mib
        )
        score = _mps_score(share, request, free_after, strategy)
        found.append(Target(gpu.id, partition_id, None, score, (gpu.id,)))
    return found, refused


def _mps_score(share: MpsShare, request: MpsRequest, free_after: int, strategy: Strategy) -> float:
    if strategy in ("first_fit", "product"):
        return 0.0
    memory = share.device.memory_mib
    left = free_after / memory
    if strategy == "best_fit":
        return -left
    # Memory that more requests like this one could not use, and a fresh daemon opened, both cost.
    stranded = (free_after % request.memory_mib) / memory if request.memory_mib else 0.0
    fresh = 0.5 if not share.reservations else 0.0
    return -(left + stranded + fresh)


def _mig_gpu(
    gpu: GpuState, request: MigRequest, strategy: Strategy
) -> tuple[list[Target], list[Refusal]]:
    if gpu.mode != "mig":
        return [], [Refusal(gpu.id, None, (mode_mismatch(gpu, "mig"),))]
    outcome = migfit.options(
        gpu, request.profile, "first_fit" if strategy == "product" else strategy
    )
    if isinstance(outcome, Violation):
        return [], [Refusal(gpu.id, None, (outcome,))]
    found = [
        Target(gpu.id, partition_id, None, FREE_PARTITION_BONUS, (gpu.id,))
        for partition_id in outcome.free_partitions
    ]
    if outcome.new_instance is not None:
        found.append(Target(gpu.id, None, outcome.new_instance, outcome.score, (gpu.id,)))
    elif not outcome.free_partitions:
        return [], [Refusal(gpu.id, None, (outcome.no_room,))]
    return found, []


def _mig_at(gpu: GpuState, request: MigRequest, start: int) -> Target | Refusal:
    """A new instance of the profile at ``start`` exactly, if that placement is free."""
    if gpu.mode != "mig":
        return Refusal(gpu.id, None, (mode_mismatch(gpu, "mig"),))
    outcome = migfit.instance_at(gpu, request.profile, start)
    if isinstance(outcome, Violation):
        return Refusal(gpu.id, None, (outcome,))
    return Target(gpu.id, None, outcome, 0.0, (gpu.id,))


def _rank_whole(
    snapshot: FleetSnapshot,
    request: WholeGpuRequest,
    strategy: Strategy,
    demand: Demand | None,
    feasible: list[Target],
    infeasible: list[Refusal],
) -> None:
    free_by_host: dict[int, list[int]] = {}
    for gpu in snapshot.gpus:
        problems = whole_problems(snapshot, gpu, demand)
        if problems:
            infeasible.append(Refusal(gpu.id, None, problems))
        else:
            free_by_host.setdefault(gpu.host_id, []).append(gpu.id)
    score = _whole_scorer(request.count, strategy)
    for free in free_by_host.values():
        if len(free) >= request.count:
            chosen = tuple(free[: request.count])
            feasible.append(Target(chosen[0], None, None, score(len(free)), chosen))
            continue
        lack = Violation(
            "placement.no_free_gpus",
            f"Needs {request.count} free GPUs on one host, found {len(free)}.",
            {"needed": request.count, "free": len(free)},
        )
        infeasible.extend(Refusal(g, None, (lack,)) for g in free)


def _whole_on(
    snapshot: FleetSnapshot,
    request: WholeGpuRequest,
    gpu: GpuState,
    partition_id: int | None,
    demand: Demand | None,
) -> Target | Refusal:
    """``count`` free dedicated GPUs of ``gpu``'s host, ``gpu`` first, the others in order."""
    problems = list(whole_problems(snapshot, gpu, demand))
    if partition_id is not None and partition_id != gpu.whole_partition_id:
        problems.append(
            Violation("placement.mode_mismatch", f"Partition {partition_id} is not a whole GPU.")
        )
    if problems:
        return Refusal(gpu.id, partition_id, tuple(problems))
    others = [
        g.id
        for g in snapshot.gpus
        if g.host_id == gpu.host_id and g.id != gpu.id and not whole_problems(snapshot, g, demand)
    ]
    chosen = (gpu.id, *others[: request.count - 1])
    if len(chosen) < request.count:
        lack = Violation(
            "placement.no_free_gpus",
            f"Needs {request.count} free GPUs on one host, found {len(chosen)}.",
            {"needed": request.count, "free": len(chosen)},
        )
        return Refusal(gpu.id, partition_id, (lack,))
    return Target(gpu.id, None, None, 0.0, chosen)


def _whole_scorer(count: int, strategy: Strategy) -> Callable[[int], float]:
    if strategy in ("first_fit", "product"):
        return lambda free: 0.0
    if strategy == "best_fit":
        return lambda free: -float(free - count)
    # Keep whole hosts for large requests: an exact fill is best, then the fewest GPUs left.
    return lambda free: (1.0 if free == count else 0.0) - float(free - count)
