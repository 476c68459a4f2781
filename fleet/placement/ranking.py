"""What the fit function answers: feasible targets, refusals, and a ranking of both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleet.domain import Violation
from fleet.mig import Instance


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


class Ranking:
    """Feasible targets best first, and the reasons for the others.

    Built from the two tuples, or lazily (:meth:`deferred`): the product strategy knows its best
    target after one pass over the fleet and builds the full lists, with the same rules, only when
    a caller reads them (the API does; the auto-placer and the benchmark read ``best``).
    """

    __slots__ = ("_best", "_feasible", "_infeasible", "_make_feasible", "_make_infeasible")

    def __init__(
        self, feasible: tuple[Target, ...] = (), infeasible: tuple[Refusal, ...] = ()
    ) -> None:
        self._feasible: tuple[Target, ...] | None = tuple(feasible)
        self._infeasible: tuple[Refusal, ...] | None = tuple(infeasible)
        self._best: Target | None = self._feasible[0] if self._feasible else None
        self._make_feasible: Callable[[], tuple[Target, ...]] | None = None
        self._make_infeasible: Callable[[], tuple[Refusal, ...]] | None = None

    @classmethod
    def deferred(
        cls,
        best: Target | None,
        feasible: Callable[[], tuple[Target, ...]],
        infeasible: Callable[[], tuple[Refusal, ...]],
    ) -> Ranking:
        """A ranking whose lists are built on first read; ``feasible()[0]`` must be ``best``."""
        ranking = cls()
        ranking._best = best
        ranking._feasible = ranking._infeasible = None
        ranking._make_feasible, ranking._make_infeasible = feasible, infeasible
        return ranking

    @property
    def feasible(self) -> tuple[Target, ...]:
        """Every feasible target, best first (ties in snapshot order)."""
        if self._feasible is None:
            assert self._make_feasible is not None
            self._feasible, self._make_feasible = self._make_feasible(), None
        return self._feasible

    @property
    def infeasible(self) -> tuple[Refusal, ...]:
        """A refusal for every GPU (or partition) that cannot take the request."""
        if self._infeasible is None:
            assert self._make_infeasible is not None
            self._infeasible, self._make_infeasible = self._make_infeasible(), None
        return self._infeasible

    @property
    def best(self) -> Target | None:
        """The best target, or ``None`` when nothing fits."""
        return self._best

    def verdict(self, gpu_id: int, partition_id: int | None = None) -> Target | Refusal | None:
        """The answer for one GPU (and partition): the drag-and-drop preview."""
        for target in self.feasible:
            if target.gpu_id == gpu_id and partition_id in (None, target.partition_id):
                return target
        for refusal in self.infeasible:
            if refusal.gpu_id == gpu_id and partition_id in (None, refusal.partition_id):
                return refusal
        return None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ranking):
            return NotImplemented
        return (self.feasible, self.infeasible) == (other.feasible, other.infeasible)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Ranking(feasible={self.feasible!r}, infeasible={self.infeasible!r})"
