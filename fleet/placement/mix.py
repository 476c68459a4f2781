"""The fleet's request mix: which request shapes come, and how often.

The product strategy measures fragmentation against this mix, as FGD does against a workload's
pod types, but the mix is learned online from the requests the fleet has seen (the Django side
builds it from the deployments, replicas weighted; the trace benchmark from the arrivals so far),
never from a trace's own future. Without a mix the strategy uses :data:`NEUTRAL_MIX`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fleet.mps import MpsRequest
from fleet.placement.snapshot import Demand, MigRequest, PlacementRequest, WholeGpuRequest

ShapeKind = Literal["gpu", "host", "mig", "mps"]
DEFAULT_COVERAGE = 0.95
ANY_PROFILE = "*"
"""A MIG shape of every profile size of the GPU's product, equally weighted."""


@dataclass(frozen=True, order=True)
class RequestShape:
    """One kind of request, as fragmentation sees it.

    Attributes:
        kind: ``mps`` (a share), ``mig`` (a profile), ``gpu`` (whole GPUs on one host) or
            ``host`` (host CPU and memory only: the trace's CPU-only pods; the product has none).
        memory_mib: an MPS share's reserved device memory, as requested.
        compute_percent: an MPS share's compute cap in percent (0: none asked for).
        profile: a MIG profile name (``3g.40gb``, lower case, no ``mig-`` prefix), or
            :data:`ANY_PROFILE`.
        gpu_count: whole GPUs.
        cpu_milli: host CPU, where the fleet tracks it (0 in the product).
        host_memory_mib: host memory, where the fleet tracks it (0 in the product).
        products: the GPU products the request may use; empty: any.
    """

    kind: ShapeKind
    memory_mib: int = 0
    compute_percent: int = 0
    profile: str = ""
    gpu_count: int = 0
    cpu_milli: int = 0
    host_memory_mib: int = 0
    products: tuple[str, ...] = ()


@dataclass(frozen=True)
class RequestMix:
    """Request shapes and their weights (summing to 1); equal mixes share one compiled scorer."""

    shapes: tuple[RequestShape, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights):
            raise ValueError("a mix needs one weight per shape")

    @property
    def memo(self) -> dict[Any, Any]:
        """The scorer compiled for this mix (and its memo), built on first use."""
        memo: dict[Any, Any] | None = self.__dict__.get("_memo")
        if memo is None:
            memo = self.__dict__["_memo"] = {}
        return memo

    @classmethod
    def from_counts(
        cls, counts: Mapping[RequestShape, float], coverage: float = DEFAULT_COVERAGE
    ) -> RequestMix:
        """FGD's rule: keep the most frequent shapes until they cover ``coverage`` of the
        requests (ties by shape), then renormalise. Empty counts give the empty mix."""
        total = sum(counts.values())
        if total <= 0:
            return cls((), ())
        ranked = sorted(
            ((s, c) for s, c in counts.items() if c > 0), key=lambda sc: (-sc[1], sc[0])
        )
        kept: list[tuple[RequestShape, float]] = []
        covered = 0.0
        for shape, count in ranked:
            kept.append((shape, count))
            covered += count
            if covered >= coverage * total:
                break
        return cls(tuple(s for s, _ in kept), tuple(c / covered for _, c in kept))

    @classmethod
    def of(cls, requests: Iterable[tuple[PlacementRequest, float]]) -> RequestMix:
        """The mix of ``(request, weight)`` pairs (a deployment's weight: its replicas)."""
        counts: dict[RequestShape, float] = {}
        for request, weight in requests:
            shape = shape_of(request)
            counts[shape] = counts.get(shape, 0.0) + weight
        return cls.from_counts(counts)


def profile_name(profile: str | int) -> str:
    """The mix's spelling of a profile reference: lower case, without the ``mig-`` prefix."""
    name = str(profile).strip().lower()
    return name.removeprefix("mig-")


def shape_of(request: PlacementRequest | None, demand: Demand | None = None) -> RequestShape:
    """The shape of a request (``None``: a host-only request, the trace's CPU-only pods)."""
    extra: dict[str, Any] = {}
    if demand is not None:
        extra = {
            "cpu_milli": demand.cpu_milli,
            "host_memory_mib": demand.host_memory_mib,
            "products": tuple(sorted(demand.products)),
        }
    if request is None:
        return RequestShape("host", **extra)
    if isinstance(request, MigRequest):
        return RequestShape("mig", profile=profile_name(request.profile), **extra)
    if isinstance(request, WholeGpuRequest):
        return RequestShape("gpu", gpu_count=request.count, **extra)
    assert isinstance(request, MpsRequest)
    return RequestShape(
        "mps",
        memory_mib=request.memory_mib,
        compute_percent=request.max_compute_percent or 0,
        **extra,
    )


NEUTRAL_MIX = RequestMix(
    (
        RequestShape("gpu", gpu_count=1),
        RequestShape("gpu", gpu_count=2),
        RequestShape("gpu", gpu_count=4),
        RequestShape("gpu", gpu_count=8),
        RequestShape("mig", profile=ANY_PROFILE),
    ),
    (0.4, 0.15, 0.1, 0.1, 0.25),
)
"""What the strategy assumes before the fleet has seen any request: whole GPUs (so shares pack
onto GPUs already in use), whole hosts of 2-8 GPUs, and every MIG profile size."""


class MixLearner:
    """Learns a mix online: counts shapes, and refreshes the mix after 1, 2, 4, 8, ... requests
    (a stationary mix settles early, and rare refreshes keep the scorer's memo warm)."""

    def __init__(self, coverage: float = DEFAULT_COVERAGE) -> None:
        self.coverage = coverage
        self.counts: Counter[RequestShape] = Counter()
        self.seen = 0
        self._next_refresh = 1
        self.mix: RequestMix | None = None

    def observe(self, shape: RequestShape, weight: int = 1) -> None:
        """Count ``weight`` requests of ``shape``."""
        self.counts[shape] += weight
        self.seen += weight
        if self.seen >= self._next_refresh:
            self.mix = RequestMix.from_counts(self.counts, self.coverage)
            self._next_refresh = self.seen * 2
