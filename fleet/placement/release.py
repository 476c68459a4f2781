"""Which replica to give back: the one whose removal leaves the fleet least fragmented.

Scale-in chooses *where*, not only how many. Each candidate replica (its allocations, one per GPU
it holds) is taken off a copy of its GPUs' states, and ranked by the engine's own measures:

1. it frees a whole GPU (nothing else runs there), which any shape can then use;
2. the host's fragmentation (:mod:`fleet.placement.fragment`, milli-GPU the request mix cannot
   use) drops the most, or grows the least: freeing the last busy slice of a MIG GPU's larger
   span restores a larger profile there, and the measure sees it;
3. then the newest replica, as a plain scale-down would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from fleet.placement.fragment import scorer_for
from fleet.placement.mix import RequestMix
from fleet.placement.signature import gpu_sig
from fleet.placement.snapshot import FleetSnapshot, GpuState


@dataclass(frozen=True)
class Candidate:
    """One replica that may go: ``allocations`` as ``(gpu id, allocation id)``, one per GPU."""

    replica: int
    allocations: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Release:
    replica: int
    frees_gpus: int  # GPUs left with nothing placed on them
    delta_milli: float  # the hosts' fragmentation after, minus before (lower is better)


def without(gpu: GpuState, allocation_id: int) -> GpuState:
    """``gpu`` with the allocation ``allocation_id`` gone. Its MIG instance goes too: an idle
    instance is the engine's to destroy when a larger profile needs its slices (reshaping takes
    idle instances only), so what the release makes possible is measured, not the leftover."""
    if gpu.mode == "mps" and allocation_id in gpu.mps_reservation_ids:
        keep = [k for k, i in enumerate(gpu.mps_reservation_ids) if i != allocation_id]
        return replace(
            gpu,
            mps_reservations=tuple(gpu.mps_reservations[k] for k in keep),
            mps_reservation_ids=tuple(gpu.mps_reservation_ids[k] for k in keep),
        )
    partitions = []
    for p in gpu.partitions:
        if p.mps is not None and allocation_id in p.mps.reservation_ids:
            keep = [k for k, i in enumerate(p.mps.reservation_ids) if i != allocation_id]
            share = replace(
                p.mps,
                reservations=tuple(p.mps.reservations[k] for k in keep),
                reservation_ids=tuple(p.mps.reservation_ids[k] for k in keep),
            )
            p = replace(p, mps=share, occupied=bool(keep) or p.mps.blocked)
        elif p.allocation_id == allocation_id:
            continue
        partitions.append(p)
    if gpu.mode == "dedicated" and gpu.taken and not gpu.partitions:
        return replace(gpu, taken=False, partitions=tuple(partitions))
    return replace(gpu, partitions=tuple(partitions))


def idle(gpu: GpuState) -> bool:
    return not (gpu.taken or gpu.mps_reservations or any(p.occupied for p in gpu.partitions))


def rank_releases(
    snapshot: FleetSnapshot, candidates: Sequence[Candidate], mix: RequestMix | None = None
) -> list[Release]:
    """``candidates`` ranked best first (see the module's docstring). A candidate on a GPU the
    snapshot does not hold ranks last: nothing is known of what its removal frees."""
    scorer = scorer_for(mix)
    gpus = {g.id: g for g in snapshot.gpus}
    ranked: list[tuple[tuple[int, float, int], Release]] = []
    for candidate in candidates:
        changed: dict[int, GpuState] = {}
        for gpu_id, allocation_id in candidate.allocations:
            gpu = changed.get(gpu_id) or gpus.get(gpu_id)
            if gpu is None:
                break
            changed[gpu_id] = without(gpu, allocation_id)
        else:
            frees = sum(
                1 for gpu_id, gpu in changed.items() if idle(gpu) and not idle(gpus[gpu_id])
            )
            delta = 0.0
            for host_id in sorted({g.host_id for g in changed.values()}):
                group = snapshot.group(host_id)
                if group is None:
                    continue
                after = [gpu_sig(changed.get(g.id, g)) for g in group.gpus]
                delta += scorer.of(scorer.host_key(group, after)) - scorer.of(
                    scorer.host_key(group)
                )
            release = Release(candidate.replica, frees, round(delta, 3))
            ranked.append(((-frees, release.delta_milli, -candidate.replica), release))
            continue
        ranked.append(
            ((1, float("inf"), -candidate.replica), Release(candidate.replica, 0, float("inf")))
        )
    return [release for _, release in sorted(ranked, key=lambda item: item[0])]
