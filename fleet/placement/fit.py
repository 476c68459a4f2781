"""The one fit function: rank every target of a request on a fleet snapshot.

The API, the drag-and-drop preview, auto-placement and the planner all call :func:`rank`; the
place service re-checks the chosen target under row locks. Ties keep the snapshot's GPU order.

Semantics:
    * MPS (ECS): a client reserves ``memory_mib`` on a GPU in MPS mode; capacity is the sum of
      reservations, never live use; the compute cap is validated, not summed.
    * MIG (SageMaker): one profile per replica; a free partition of that profile first, else a new
      instance in free slices of a MIG-mode GPU, never touching busy instances.
    * Whole GPU: ``count`` free dedicated GPUs on one host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from fleet.domain import Violation
from fleet.mig import Instance
from fleet.mps import MpsDevice, MpsRequest, check_fit
from fleet.placement import migfit
from fleet.placement.snapshot import (
    FleetSnapshot,
    GpuState,
    MigRequest,
    PlacementRequest,
    WholeGpuRequest,
)

Strategy = Literal["first_fit", "best_fit", "fragmentation_aware"]
STRATEGIES: tuple[Strategy, ...] = ("first_fit", "best_fit", "fragmentation_aware")
DEFAULT_STRATEGY: Strategy = "fragmentation_aware"
FREE_PARTITION_BONUS = 1000.0

_MPS_CODES = {
    "mps.memory_invalid": "placement.memory",
    "mps.memory_exceeds_device": "placement.memory",
    "mps.memory_overcommit": "placement.memory",
    "mps.too_many_clients": "placement.clients",
    "mps.compute_percent_out_of_range": "placement.compute",
    "mps.exceeds_policy_limit": "placement.compute",
}


@dataclass(frozen=True)
class Target:
    """A feasible placement; higher ``score`` is better.

    Attributes:
        gpu_id: the GPU (for a multi-GPU request, the first of ``gpu_ids``).
        partition_id: an existing free MIG partition to use, else ``None``.
        new_instance: the MIG instance to create, else ``None``.
        gpu_ids: every GPU the request takes.
    """

    gpu_id: int
    partition_id: int | None
    new_instance: Instance | None
    score: float
    gpu_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """Why a GPU (or partition) cannot take the request."""

    gpu_id: int
    partition_id: int | None
    violations: tuple[Violation, ...]


@dataclass(frozen=True)
class Ranking:
    """Feasible targets best first, and the reasons for the others."""

    feasible: tuple[Target, ...]
    infeasible: tuple[Refusal, ...]

    @property
    def best(self) -> Target | None:
        """The best target, or ``None`` when nothing fits."""
        return self.feasible[0] if self.feasible else None

    def verdict(self, gpu_id: int, partition_id: int | None = None) -> Target | Refusal | None:
        """The answer for one GPU (and partition): the drag-and-drop preview."""
        for target in self.feasible:
            if target.gpu_id == gpu_id and partition_id in (None, target.partition_id):
                return target
        for refusal in self.infeasible:
            if refusal.gpu_id == gpu_id and partition_id in (None, refusal.partition_id):
                return refusal
        return None


def rank(
    snapshot: FleetSnapshot,
    request: PlacementRequest,
    *,
    strategy: Strategy = DEFAULT_STRATEGY,
) -> Ranking:
    """Rank every target of ``request`` on ``snapshot``.

    Args:
        snapshot: the fleet as last observed.
        request: a :class:`MigRequest`, an MPS request or a :class:`WholeGpuRequest`.
        strategy: ``first_fit`` (snapshot order), ``best_fit`` (least room left) or
            ``fragmentation_aware`` (keeps room for likely requests and large MIG profiles).

    Returns:
        The ranking; ``feasible`` is empty (and ``infeasible`` says why) when nothing fits.

    Raises:
        ValueError: for an unknown strategy.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    feasible: list[Target] = []
    infeasible: list[Refusal] = []
    if isinstance(request, WholeGpuRequest):
        _rank_whole(snapshot, request, strategy, feasible, infeasible)
    else:
        for gpu in snapshot.gpus:
            blocked = eligibility(snapshot, gpu)
            if blocked:
                infeasible.append(Refusal(gpu.id, None, blocked))
            elif isinstance(request, MigRequest):
                _mig_gpu(gpu, request, strategy, feasible, infeasible)
            else:
                _mps_gpu(gpu, request, strategy, feasible, infeasible)
    order = sorted(range(len(feasible)), key=lambda k: -feasible[k].score)
    return Ranking(tuple(feasible[k] for k in order), tuple(infeasible))


def eligibility(snapshot: FleetSnapshot, gpu: GpuState) -> tuple[Violation, ...]:
    """Health and cordon violations of a GPU and its host."""
    violations: list[Violation] = []
    host = snapshot.host(gpu.host_id)
    if host is None or not host.healthy or not gpu.healthy:
        violations.append(
            Violation("placement.unhealthy", f"GPU {gpu.id} or its host is unhealthy.")
        )
    if (host is not None and host.cordoned) or gpu.cordoned:
        violations.append(Violation("placement.cordoned", f"GPU {gpu.id} or its host is cordoned."))
    return tuple(violations)


def _mode_mismatch(gpu: GpuState, wanted: str) -> Violation:
    return Violation(
        "placement.mode_mismatch",
        f"GPU {gpu.id} is in {gpu.mode} mode, not {wanted}.",
        {"mode": gpu.mode, "wanted": wanted},
    )


def _mps_gpu(
    gpu: GpuState,
    request: MpsRequest,
    strategy: Strategy,
    feasible: list[Target],
    infeasible: list[Refusal],
) -> None:
    if gpu.mode != "mps":
        infeasible.append(Refusal(gpu.id, None, (_mode_mismatch(gpu, "mps"),)))
        return
    device = MpsDevice.whole_gpu(gpu.memory_mib)
    if gpu.mps_max_clients is not None:
        device = MpsDevice(gpu.memory_mib, max(1, gpu.mps_max_clients))
    problems = check_fit(device, gpu.mps_reservations, request)
    if problems:
        infeasible.append(Refusal(gpu.id, None, tuple(_as_placement(v) for v in problems)))
        return
    free_after = (
        gpu.memory_mib - sum(r.memory_mib for r in gpu.mps_reservations) - request.memory_mib
    )
    feasible.append(
        Target(gpu.id, None, None, _mps_score(gpu, request, free_after, strategy), (gpu.id,))
    )


def _as_placement(violation: Violation) -> Violation:
    code = _MPS_CODES.get(violation.code, "placement.mps")
    return Violation(code, violation.message, {**violation.details, "rule": violation.code})


def _mps_score(gpu: GpuState, request: MpsRequest, free_after: int, strategy: Strategy) -> float:
    if strategy == "first_fit":
        return 0.0
    left = free_after / gpu.memory_mib
    if strategy == "best_fit":
        return -left
    # Memory that more requests like this one could not use, and a fresh GPU opened, both cost.
    stranded = (free_after % request.memory_mib) / gpu.memory_mib if request.memory_mib else 0.0
    fresh = 0.5 if not gpu.mps_reservations else 0.0
    return -(left + stranded + fresh)


def _mig_gpu(
    gpu: GpuState,
    request: MigRequest,
    strategy: Strategy,
    feasible: list[Target],
    infeasible: list[Refusal],
) -> None:
    if gpu.mode != "mig":
        infeasible.append(Refusal(gpu.id, None, (_mode_mismatch(gpu, "mig"),)))
        return
    outcome = migfit.options(gpu, request.profile, strategy)
    if isinstance(outcome, Violation):
        infeasible.append(Refusal(gpu.id, None, (outcome,)))
        return
    for partition_id in outcome.free_partitions:
        feasible.append(Target(gpu.id, partition_id, None, FREE_PARTITION_BONUS, (gpu.id,)))
    if outcome.new_instance is not None:
        feasible.append(Target(gpu.id, None, outcome.new_instance, outcome.score, (gpu.id,)))
    elif not outcome.free_partitions:
        infeasible.append(Refusal(gpu.id, None, (outcome.no_room,)))


def _rank_whole(
    snapshot: FleetSnapshot,
    request: WholeGpuRequest,
    strategy: Strategy,
    feasible: list[Target],
    infeasible: list[Refusal],
) -> None:
    free_by_host: dict[int, list[int]] = {}
    for gpu in snapshot.gpus:
        problems = list(eligibility(snapshot, gpu))
        if gpu.mode != "dedicated":
            problems.append(_mode_mismatch(gpu, "dedicated"))
        elif gpu.taken:
            problems.append(
                Violation("placement.gpu_busy", f"GPU {gpu.id} already runs a workload.")
            )
        if problems:
            infeasible.append(Refusal(gpu.id, None, tuple(problems)))
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


def _whole_scorer(count: int, strategy: Strategy) -> Callable[[int], float]:
    if strategy == "first_fit":
        return lambda free: 0.0
    if strategy == "best_fit":
        return lambda free: -float(free - count)
    # Keep whole hosts for large requests: an exact fill is best, then the fewest GPUs left.
    return lambda free: (1.0 if free == count else 0.0) - float(free - count)
