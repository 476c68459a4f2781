"""What a repack plan is: the plan (moves, GPUs freed, cost and bound, how it was found), and
the replicas of a candidate GPU it may move."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fleet.placement.defrag import Move
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    PlacementRequest,
)

Method = Literal["cp-sat", "greedy"]
ReplicaKey = tuple[str, int]
"""``(Move.kind, Move.allocation_id)``."""

DEFAULT_TIME_LIMIT_S = 3.0
MAX_PAIRS = 50_000
"""Replica-to-GPU pairs above which the model is not built (the greedy plan answers)."""
SOLVER_WORKERS = 2
MODEL_SLACK = 24
"""The model holds the ``count + MODEL_SLACK`` cheapest candidates (an optimum empties cheap
GPUs); with fewer left out, the solver's bound is proven for the whole fleet."""
SOLVER_STATUSES = frozenset({"optimal", "feasible", "infeasible", "unknown"})


@dataclass(frozen=True)
class RepackPlan:
    """A repack proposal.

    Attributes:
        product_key: the product whose GPUs are emptied.
        asked: how many GPUs were asked for.
        feasible: whether ``asked`` GPUs can be emptied (``reason`` says why not).
        moves: in order, make before break, grouped by the GPU they empty.
        freed: the GPUs the moves empty.
        cost: replicas moved.
        bound: no plan emptying ``asked`` GPUs moves fewer replicas (proven; 0 when infeasible).
        method: ``cp-sat`` or ``greedy``.
        status: the solver's status (``optimal``, ``feasible``, ``infeasible``, ``unknown``) or
            why it did not run (``not_installed``, ``too_big``, ``no_candidates``).
        reason: why the plan is infeasible, or why the greedy plan was used; empty otherwise.
        unmovable: GPUs of the product that hold something and cannot be emptied, with why.
        already_free: GPUs of the product holding nothing now.
        snapshot: the fleet after the moves.
    """

    product_key: str
    asked: int
    feasible: bool
    moves: tuple[Move, ...]
    freed: tuple[int, ...]
    cost: int
    bound: int
    method: Method
    status: str
    reason: str
    unmovable: tuple[tuple[int, str], ...]
    already_free: int
    snapshot: FleetSnapshot


@dataclass(frozen=True)
class Replica:
    """One replica on a candidate GPU: its key, its GPU, what it asks and needs beside;
    ``occupied`` false: an idle MIG instance (destroyed for free when its GPU is emptied)."""

    key: ReplicaKey
    gpu_id: int
    request: PlacementRequest
    demand: Demand | None
    occupied: bool = True


@dataclass(frozen=True)
class Solved:
    """CP-SAT's answer: its status, the GPUs it empties, where each moved replica lands, and
    its proven bound."""

    status: str
    emptied: tuple[int, ...]
    landing: dict[ReplicaKey, int]
    bound: int
