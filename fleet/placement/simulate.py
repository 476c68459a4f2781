"""Placing replicas one after another on a snapshot, writing nothing: how many of a deployment's
unplaced replicas fit now, where the next one goes, and the main reason when none fits.

Each replica is ranked on the snapshot left by the ones before it, with the target
:func:`fleet.placement.rank` finds best applied as the place service writes it
(:func:`apply_target`). That is what auto-placement does against the database, one replica at a
time, so the count is what it would place if nothing else changes in between.
:meth:`FleetSnapshot.with_changes` keeps the engine's memos of the hosts not touched, so each
further replica costs about one host, not the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fleet.domain import Violation
from fleet.mps import MpsRequest
from fleet.placement.fit import DEFAULT_STRATEGY, Strategy, rank
from fleet.placement.mix import RequestMix
from fleet.placement.ranking import Ranking, Refusal, Target
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    MigPartition,
    PlacementRequest,
    WholeGpuRequest,
)

__all__ = ["Reason", "Turns", "apply_target", "main_reasons", "place_in_turn"]

NOT_A_CANDIDATE = frozenset(
    {"placement.mode_mismatch", "placement.unhealthy", "placement.cordoned"}
)
"""Refusals of GPUs that were never candidates (another sharing mode, out of service): the main
reason is one of the others when there is one (a full MIG GPU says more than an MPS GPU)."""


@dataclass(frozen=True)
class Turns:
    """Replicas placed one after another.

    Attributes:
        targets: the target of each replica that fit, in order (the first is the best target of
            the next replica now).
        first: the ranking of the next replica on the snapshot given.
        stopped: the ranking that found no target, ``None`` when every replica asked for fit.
        snapshot: the snapshot after the replicas that fit.
    """

    targets: tuple[Target, ...]
    first: Ranking
    stopped: Ranking | None
    snapshot: FleetSnapshot


@dataclass(frozen=True)
class Reason:
    """A refusal code of a ranking: its first violation, and how many refusals gave it."""

    violation: Violation
    refusals: int


def apply_target(
    snapshot: FleetSnapshot, request: PlacementRequest, target: Target
) -> FleetSnapshot:
    """The snapshot after placing ``request`` on ``target``, as the place service writes it: a
    whole GPU taken, an MPS client reserved on its daemon, a free MIG partition occupied or a new
    instance created (with a negative id, which no real partition has).

    Raises:
        KeyError: for a GPU of ``target`` that the snapshot does not have.
    """
    changed: list[GpuState] = []
    for gpu_id in target.gpu_ids or (target.gpu_id,):
        gpu = snapshot.gpu(gpu_id)
        if gpu is None:
            raise KeyError(f"GPU {gpu_id} is not in the snapshot")
        changed.append(_placed(gpu, request, target))
    return snapshot.with_changes(gpus=changed)


def place_in_turn(
    snapshot: FleetSnapshot,
    request: PlacementRequest,
    count: int,
    *,
    strategy: Strategy = DEFAULT_STRATEGY,
    mix: RequestMix | None = None,
    demand: Demand | None = None,
) -> Turns:
    """Place up to ``count`` replicas of ``request`` one after another, each on the best target
    left by those before it; stops at the first that fits nowhere."""
    first = ranking = rank(snapshot, request, strategy=strategy, mix=mix, demand=demand)
    targets: list[Target] = []
    while len(targets) < count:
        best = ranking.best
        if best is None:
            return Turns(tuple(targets), first, ranking, snapshot)
        targets.append(best)
        snapshot = apply_target(snapshot, request, best)
        if len(targets) < count:
            ranking = rank(snapshot, request, strategy=strategy, mix=mix, demand=demand)
    return Turns(tuple(targets), first, None, snapshot)


def main_reasons(ranking: Ranking, limit: int = 3) -> tuple[Reason, ...]:
    """Why nothing fits, most telling first: the refusal codes of ``ranking`` by how many GPUs
    (or partitions) gave them, the codes of GPUs that were never candidates
    (:data:`NOT_A_CANDIDATE`) last; ties in the snapshot's order. Each code is counted once per
    refusal and shown by its first violation."""
    counts: dict[str, int] = {}
    first: dict[str, Violation] = {}
    for refusal in ranking.infeasible:
        for code in _codes(refusal):
            counts[code] = counts.get(code, 0) + 1
        for violation in refusal.violations:
            first.setdefault(violation.code, violation)
    order = sorted(counts, key=lambda code: (code in NOT_A_CANDIDATE, -counts[code]))
    return tuple(Reason(first[code], counts[code]) for code in order[:limit])


def _with_id(ids: tuple[int, ...]) -> tuple[int, ...]:
    """Reservation ids, where the caller gave them, with one for a simulated client (negative:
    no allocation has it)."""
    return (*ids, -(len(ids) + 1)) if ids else ()


def _with_client(partition: MigPartition, request: MpsRequest) -> MigPartition:
    share = partition.mps
    if share is None:
        raise ValueError(f"partition {partition.id} runs no MPS daemon")
    return replace(
        partition,
        occupied=True,
        mps=replace(
            share,
            reservations=(*share.reservations, request),
            reservation_ids=_with_id(share.reservation_ids),
        ),
    )


def _codes(refusal: Refusal) -> set[str]:
    return {violation.code for violation in refusal.violations}


def _placed(gpu: GpuState, request: PlacementRequest, target: Target) -> GpuState:
    if isinstance(request, WholeGpuRequest):
        return replace(gpu, taken=True)
    if isinstance(request, MpsRequest):
        if gpu.mode == "mps":
            return replace(
                gpu,
                mps_reservations=(*gpu.mps_reservations, request),
                mps_reservation_ids=_with_id(gpu.mps_reservation_ids),
            )
        return replace(
            gpu,
            partitions=tuple(
                _with_client(p, request) if p.id == target.partition_id else p
                for p in gpu.partitions
            ),
        )
    if target.partition_id is not None:
        return replace(
            gpu,
            partitions=tuple(
                replace(p, occupied=True) if p.id == target.partition_id else p
                for p in gpu.partitions
            ),
        )
    instance = target.new_instance
    if instance is None:
        raise ValueError(f"a MIG target on GPU {gpu.id} names no partition and no new instance")
    # Unique in the snapshot: one instance per start on a GPU, and real ids are positive.
    created = MigPartition(
        -(gpu.id * 64 + instance.start + 1), instance.profile_id, instance.start, True
    )
    return replace(gpu, partitions=(*gpu.partitions, created))
