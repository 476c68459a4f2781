"""Pure placement engine: fleet snapshots, the fit function, strategies and the trace benchmark.

Stdlib only (OR-Tools is imported lazily by :func:`repack`, which falls back to a heuristic
without it): importing this package never boots Django. The product API is :func:`rank`;
:mod:`fleet.placement.bench` replays the Alibaba traces under the published FGD protocol and
:mod:`fleet.placement.migbench` their MIG variant; :mod:`fleet.placement.defrag` plans moves.
"""

from __future__ import annotations

from fleet.placement.defrag import FreePlan, Move, MovePlan, plan_free_gpus, plan_moves
from fleet.placement.fit import (
    DEFAULT_STRATEGY,
    STRATEGIES,
    Ranking,
    Refusal,
    Strategy,
    Target,
    rank,
)
from fleet.placement.repack import RepackResult, repack
from fleet.placement.snapshot import (
    FleetSnapshot,
    GpuMode,
    GpuState,
    HostState,
    MigPartition,
    MigRequest,
    MpsRequest,
    PlacementRequest,
    WholeGpuRequest,
)

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "FleetSnapshot",
    "FreePlan",
    "GpuMode",
    "GpuState",
    "HostState",
    "MigPartition",
    "MigRequest",
    "Move",
    "MovePlan",
    "MpsRequest",
    "PlacementRequest",
    "Ranking",
    "Refusal",
    "RepackResult",
    "Strategy",
    "Target",
    "WholeGpuRequest",
    "plan_free_gpus",
    "plan_moves",
    "rank",
    "repack",
]
