"""A fast MIG fleet for benchmarks and repacking: GPUs grouped by layout, one fit per layout.

Every GPU of one product in the same layout offers the same new instance with the same score, so
the fit of :func:`fleet.placement.migfit.best_new_instance` (the one :func:`fleet.placement.rank`
uses) is computed once per distinct layout and cached. Ties go to the lowest GPU index, like
``rank``'s snapshot order, so a decision here is the decision ``rank`` takes on the same fleet.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from fleet.mig import Instance, Product, Profile
from fleet.mig.rules import instance_sort_key
from fleet.placement import migfit
from fleet.placement.snapshot import FleetSnapshot, GpuState, HostState, MigPartition

Layout = tuple[Instance, ...]
"""A GPU's instances, sorted by start then profile id."""

Scorer = Callable[[Product, Profile, Layout], tuple[Instance | None, float]]
"""The best new instance of a profile on a layout, with its score (higher is better)."""


def strategy_scorer(strategy: str) -> Scorer:
    """The scorer of one of :func:`fleet.placement.rank`'s strategies."""

    def score(product: Product, profile: Profile, layout: Layout) -> tuple[Instance | None, float]:
        return migfit.best_new_instance(product, profile, layout, strategy)

    return score


def with_instance(layout: Layout, instance: Instance) -> Layout:
    """``layout`` plus ``instance``, kept sorted."""
    return tuple(sorted((*layout, instance), key=instance_sort_key))


def without_instance(layout: Layout, instance: Instance) -> Layout:
    """``layout`` less one copy of ``instance``."""
    rest = list(layout)
    rest.remove(instance)
    return tuple(rest)


class MigFleet:
    """GPUs of one MIG product; a fixed count, or opened on demand when ``gpu_count`` is ``None``.

    Args:
        product: the GPU product (every GPU in MIG mode).
        scorer: how to pick and score the new instance on one layout.
        gpu_count: fleet size; ``None`` opens a fresh GPU whenever one is needed.
    """

    def __init__(self, product: Product, scorer: Scorer, gpu_count: int | None = None) -> None:
        self.product = product
        self._scorer = scorer
        self._open_ended = gpu_count is None
        self.layouts: list[Layout] = [() for _ in range(gpu_count or 0)]
        self._members: dict[Layout, list[int]] = {(): list(range(gpu_count or 0))}
        self._cache: dict[tuple[Layout, int], tuple[Instance | None, float]] = {}

    @property
    def gpus_used(self) -> int:
        """GPUs that hold at least one instance."""
        return sum(1 for layout in self.layouts if layout)

    def first_gpu(self, layout: Layout) -> int | None:
        """The lowest GPU index in ``layout`` (a fresh index for ``()`` when open-ended)."""
        heap = self._members.get(layout)
        while heap and self.layouts[heap[0]] != layout:
            heapq.heappop(heap)
        if heap:
            return heap[0]
        return len(self.layouts) if self._open_ended and not layout else None

    def fit(self, profile: Profile) -> tuple[int, Instance] | None:
        """The GPU and new instance the scorer prefers for ``profile``, or ``None``."""
        best: tuple[float, int, Instance] | None = None
        for layout in list(self._members):
            gpu = self.first_gpu(layout)
            if gpu is None:
                continue
            instance, score = self._score(profile, layout)
            if instance is None:
                continue
            if best is None or (-score, gpu) < (-best[0], best[1]):
                best = (score, gpu, instance)
        if best is None and self._open_ended:
            instance, score = self._score(profile, ())
            if instance is not None:
                best = (score, len(self.layouts), instance)
        return None if best is None else (best[1], best[2])

    def place(self, profile: Profile) -> tuple[int, Instance] | None:
        """Create the preferred instance for ``profile``; ``None`` (no change) when none fits."""
        choice = self.fit(profile)
        if choice is not None:
            self.add(*choice)
        return choice

    def add(self, gpu: int, instance: Instance) -> None:
        """Create ``instance`` on GPU ``gpu`` (a fresh index opens one GPU when open-ended)."""
        while gpu >= len(self.layouts):
            self.layouts.append(())
        self._move(gpu, with_instance(self.layouts[gpu], instance))

    def remove(self, gpu: int, instance: Instance) -> None:
        """Destroy ``instance`` on GPU ``gpu``."""
        self._move(gpu, without_instance(self.layouts[gpu], instance))

    def _move(self, gpu: int, layout: Layout) -> None:
        self.layouts[gpu] = layout
        heapq.heappush(self._members.setdefault(layout, []), gpu)

    def _score(self, profile: Profile, layout: Layout) -> tuple[Instance | None, float]:
        key = (layout, profile.id)
        if key not in self._cache:
            self._cache[key] = self._scorer(self.product, profile, layout)
        return self._cache[key]


def as_snapshot(fleet: MigFleet) -> FleetSnapshot:
    """The fleet as a :class:`FleetSnapshot` (one host, every instance occupied) for ``rank``."""
    gpus = tuple(
        GpuState(
            id=index,
            host_id=0,
            product_key=fleet.product.key,
            memory_mib=fleet.product.memory_mib,
            mode="mig",
            partitions=tuple(
                MigPartition(k, i.profile_id, i.start, occupied=True) for k, i in enumerate(layout)
            ),
        )
        for index, layout in enumerate(fleet.layouts)
    )
    return FleetSnapshot((HostState(0),), gpus)
