"""The layout advisor's values: what it is asked (the GPUs and their instances, the waiting
replicas) and what it answers (a layout per GPU)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet.mig import Product

DEFAULT_TIME_LIMIT_S = 5.0


@dataclass(frozen=True)
class ExistingInstance:
    """A MIG instance a GPU has now: ``replicas`` running in it (0: idle), ``mps``: it runs an
    MPS daemon."""

    profile_id: int
    start: int
    replicas: int = 0
    mps: bool = False


@dataclass(frozen=True)
class AdvisorGpu:
    """One schedulable GPU of the product (``product``: with its agent-reported placements)."""

    id: int
    product: Product
    instances: tuple[ExistingInstance, ...] = ()
    # False: its running replicas stay where they are (no drained layout is offered for it).
    drainable: bool = True
    # The other GPUs that every running replica of it may move to (the hosts their deployments
    # may use); ``None``: any. A GPU is drained only where its replicas may go to each GPU of
    # the waiting group being solved: the model places a moved replica on any of them.
    movable_to: frozenset[int] | None = None

    @property
    def busy_replicas(self) -> int:
        return sum(i.replicas for i in self.instances)


@dataclass(frozen=True)
class WaitingMig:
    """``count`` unplaced replicas of a deployment (``key``) in instances of ``profile_id``."""

    key: str
    profile_id: int
    count: int


@dataclass(frozen=True)
class WaitingMps:
    """``count`` unplaced MPS replicas of a deployment (``key``), ``memory_mib`` each."""

    key: str
    memory_mib: int
    count: int
    max_compute_percent: int | None = None


@dataclass(frozen=True)
class NewInstance:
    """An instance of the proposed layout: kept (``existing``: the index of the GPU's instance
    it keeps), or new. ``serves``: the deployment whose waiting replicas it takes (``replicas``
    of them), ``"moved"`` for one that receives a moved instance's replicas, ``""`` for a spare.
    ``mps``: run an MPS daemon in it."""

    profile_id: int
    start: int
    existing: int | None = None
    serves: str = ""
    replicas: int = 0
    mps: bool = False


@dataclass(frozen=True)
class GpuAdvice:
    """One GPU's proposed layout; ``changed``: it differs from the current one; ``drained``:
    its running replicas must move first (a drain)."""

    gpu_id: int
    instances: tuple[NewInstance, ...]
    changed: bool
    drained: bool
    moved_replicas: int


@dataclass(frozen=True)
class Advice:
    """The advisor's answer.

    Attributes:
        gpus: every GPU's proposed layout (changed or not), in the input's order.
        placed: waiting replicas placed, per deployment key.
        waiting: waiting replicas asked for, per deployment key.
        moved_replicas: running replicas that must move (those of drained GPUs).
        objective: the solver's objective value of this answer.
        bound: the solver's proven bound on the objective (equal to ``objective`` when optimal).
        gap_percent: ``100 * (bound - objective) / bound``.
        status: ``optimal``, ``feasible`` (time limit), ``heuristic`` (no solver) or ``trivial``.
        time_s: solver wall time.
    """

    gpus: tuple[GpuAdvice, ...]
    placed: dict[str, int]
    waiting: dict[str, int]
    moved_replicas: int
    objective: int
    bound: int
    gap_percent: float
    status: str
    time_s: float
    weights: dict[str, int] = field(default_factory=dict)

    @property
    def placed_total(self) -> int:
        return sum(self.placed.values())


@dataclass(frozen=True)
class WaitingGroup:
    """Waiting replicas that may run only on some of the GPUs (``gpu_ids``): their deployments
    require host labels, a runtime, or room the other hosts lack."""

    gpu_ids: frozenset[int]
    mig: tuple[WaitingMig, ...] = ()
    mps: tuple[WaitingMps, ...] = ()
