"""Pure placement engine: fleet snapshots, the fit function, strategies and the trace benchmark.

Stdlib only: importing this package never boots Django. The product API is :func:`rank`;
:mod:`fleet.placement.bench` replays the Alibaba traces under the published FGD protocol.
"""

from __future__ import annotations

from fleet.placement.fit import (
    DEFAULT_STRATEGY,
    STRATEGIES,
    Ranking,
    Refusal,
    Strategy,
    Target,
    rank,
)
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
    "GpuMode",
    "GpuState",
    "HostState",
    "MigPartition",
    "MigRequest",
    "MpsRequest",
    "PlacementRequest",
    "Ranking",
    "Refusal",
    "Strategy",
    "Target",
    "WholeGpuRequest",
    "rank",
]
