"""Pure placement engine: fleet snapshots, the fit function, its strategies and defrag plans.

Stdlib only: importing this package never boots Django. The product API is :func:`rank` (and
:func:`check` for the commit, :func:`place_in_turn` for how many replicas fit now); the default
strategy, ``product``, measures fragmentation against the fleet's :class:`RequestMix`.
:mod:`fleet.placement.defrag` plans moves. The trace benchmarks that measure the engine live in
:mod:`fleet.placement.benchmarks`.
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
    check,
    gpu_options,
    rank,
)
from fleet.placement.hostfit import rank_host_only
from fleet.placement.mix import NEUTRAL_MIX, MixLearner, RequestMix, RequestShape, shape_of
from fleet.placement.simulate import Reason, Turns, apply_target, main_reasons, place_in_turn
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuMode,
    GpuState,
    HostGroup,
    HostState,
    MigPartition,
    MigRequest,
    MpsRequest,
    MpsShare,
    PlacementRequest,
    WholeGpuRequest,
)

__all__ = [
    "DEFAULT_STRATEGY",
    "NEUTRAL_MIX",
    "STRATEGIES",
    "Demand",
    "FleetSnapshot",
    "FreePlan",
    "GpuMode",
    "GpuState",
    "HostGroup",
    "HostState",
    "MigPartition",
    "MigRequest",
    "MixLearner",
    "Move",
    "MovePlan",
    "MpsRequest",
    "MpsShare",
    "PlacementRequest",
    "Ranking",
    "Reason",
    "Refusal",
    "RequestMix",
    "RequestShape",
    "Strategy",
    "Target",
    "Turns",
    "WholeGpuRequest",
    "apply_target",
    "check",
    "gpu_options",
    "main_reasons",
    "place_in_turn",
    "plan_free_gpus",
    "plan_moves",
    "rank",
    "rank_host_only",
    "shape_of",
]
