"""What fits in the fleet now, and what is stranded: per product, per host, and for one request.

Only schedulable GPUs count: those the engine's eligibility rules let take a request (a healthy,
uncordoned GPU on a healthy, uncordoned host: :func:`fleet.placement.rules.host_takes` and
:func:`~fleet.placement.rules.gpu_takes`). The numbers come from the same rules as placement:

* MIG: :func:`fleet.mig.capacity.profile_capacity` per GPU (exact; memoised per product and
  layout, since a fleet repeats a few layouts on many GPUs).
* MPS: each daemon's state as :func:`fleet.placement.rules.mps_takes` reads it; memory is
  *stranded* where no MPS shape of the mix fits (compute or client cap reached, or the piece too
  small). A daemon without clients strands nothing: its GPU (or instance) is idle and may be
  reshaped for whatever comes, as fragmentation counts an idle GPU.
* Whole GPUs: free dedicated GPUs (:func:`fleet.placement.rules.whole_free`).
* Fragmentation: the product strategy's FGD measure per host
  (:class:`fleet.placement.fragment.Fragmentation`), in milli-GPU, summed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleet.mig import (
    Instance,
    Product,
    Profile,
    ProfileCapacity,
    product_by_key,
    profile_capacity,
)
from fleet.mps import MpsRequest
from fleet.placement import migfit, rules
from fleet.placement.fragment import MILLI, scorer_for
from fleet.placement.mix import RequestMix, RequestShape
from fleet.placement.signature import mps_states
from fleet.placement.snapshot import (
    FleetSnapshot,
    GpuState,
    MigRequest,
    PlacementRequest,
    WholeGpuRequest,
)

UNKNOWN_PRODUCT = ""


@dataclass(frozen=True)
class ProfileFit:
    """One MIG profile of a product: instances that fit now, and after idle ones are reshaped."""

    profile: str
    profile_id: int
    fits_now: int
    fits_if_idle_reshaped: int


@dataclass(frozen=True)
class MpsFit:
    """The MPS daemons of a product's schedulable GPUs (whole-GPU and inside MIG instances)."""

    gpus: int
    free_memory_mib: int
    stranded_memory_mib: int
    free_clients: int


@dataclass(frozen=True)
class ProductCapacity:
    """One GPU product of the fleet."""

    product_key: str
    gpus: int
    schedulable_gpus: int
    mig_gpus: int
    profiles: tuple[ProfileFit, ...]
    mps: MpsFit
    whole_free_gpus: int


@dataclass(frozen=True)
class HostFragmentation:
    """One schedulable host: its free GPU and the part of it the mix cannot use, in milli-GPU."""

    host_id: int
    free_milli: float
    fragmented_milli: float

    @property
    def score(self) -> float:
        """The fragmented share of the free GPU (0 when nothing is free)."""
        return self.fragmented_milli / self.free_milli if self.free_milli else 0.0


@dataclass(frozen=True)
class CapacityReport:
    """The fleet's capacity: per product (by key), and fragmentation per schedulable host."""

    products: tuple[ProductCapacity, ...]
    hosts: tuple[HostFragmentation, ...]

    @property
    def free_milli(self) -> float:
        """Free GPU of the schedulable hosts, in milli-GPU."""
        return sum(h.free_milli for h in self.hosts)

    @property
    def fragmented_milli(self) -> float:
        """FGD's fragmentation of the fleet against the mix, in milli-GPU."""
        return sum(h.fragmented_milli for h in self.hosts)

    @property
    def score(self) -> float:
        """The fragmented share of the fleet's free GPU (0 when nothing is free)."""
        free = self.free_milli
        return self.fragmented_milli / free if free else 0.0

    @property
    def stranded_gpu_equivalents(self) -> float:
        """The fragmented amount in GPUs."""
        return self.fragmented_milli / MILLI


@dataclass(frozen=True)
class RequestFit:
    """How many replicas of one request fit: in the fleet, and per product (MIG and MPS).

    ``fits_if_idle_reshaped`` is ``None`` for requests that no MIG reshape helps (MPS, whole).
    """

    fits_now: int
    fits_if_idle_reshaped: int | None
    products: tuple[tuple[str, int, int | None], ...]


def schedulable(snapshot: FleetSnapshot, gpu: GpuState) -> bool:
    """Whether the engine's eligibility rules let ``gpu`` take any request."""
    return rules.host_takes(snapshot.host(gpu.host_id), None) and rules.gpu_takes(gpu, None)


def capacity(snapshot: FleetSnapshot, mix: RequestMix | None) -> CapacityReport:
    """The fleet's capacity report against the request mix (``None`` or empty: the neutral mix
    the product strategy uses).

    Args:
        snapshot: the fleet.
        mix: the fleet's request mix.

    Returns:
        Products ordered by key, hosts in snapshot order.
    """
    scorer = scorer_for(mix)
    mps_shapes = tuple(s for s in scorer.mix.shapes if s.kind == "mps")
    by_product: dict[str, list[GpuState]] = {}
    for gpu in snapshot.gpus:
        by_product.setdefault(gpu.product_key or UNKNOWN_PRODUCT, []).append(gpu)
    products = tuple(
        _product_capacity(snapshot, key, gpus, mps_shapes)
        for key, gpus in sorted(by_product.items())
    )
    hosts = []
    for group in snapshot.host_groups:
        if not rules.host_takes(group.host, None):
            continue
        key = scorer.host_key(group)
        free = sum(scorer.free(sig) for sig in key[2])
        hosts.append(HostFragmentation(group.host_id, free, scorer.of(key)))
    return CapacityReport(products, tuple(hosts))


def request_fit(snapshot: FleetSnapshot, request: PlacementRequest) -> RequestFit:
    """How many replicas of ``request`` fit, placed one after another by the engine's rules.

    MIG and MPS replicas take one GPU each, so the per-GPU counts add up: a MIG GPU gives its
    :func:`fleet.mig.capacity.profile_capacity` (any order of creating instances reaches it), an
    MPS daemon as many clients as :func:`fleet.placement.rules.mps_takes` lets in one by one. A
    whole-GPU request takes ``count`` free GPUs of one host.
    """
    if isinstance(request, WholeGpuRequest):
        free_by_host: dict[int, int] = {}
        for gpu in _schedulable(snapshot):
            if rules.whole_free(gpu, None):
                free_by_host[gpu.host_id] = free_by_host.get(gpu.host_id, 0) + 1
        count = max(1, request.count)
        return RequestFit(sum(free // count for free in free_by_host.values()), None, ())
    totals: dict[str, list[int]] = {}
    for gpu in _schedulable(snapshot):
        now, reshaped = _gpu_request_fit(gpu, request)
        if now or reshaped:
            entry = totals.setdefault(gpu.product_key or UNKNOWN_PRODUCT, [0, 0])
            entry[0] += now
            entry[1] += reshaped
    mig = isinstance(request, MigRequest)
    products = tuple(
        (key, now, reshaped if mig else None) for key, (now, reshaped) in sorted(totals.items())
    )
    return RequestFit(
        sum(p[1] for p in products),
        sum(t[1] for t in totals.values()) if mig else None,
        products,
    )


def _schedulable(snapshot: FleetSnapshot) -> Iterable[GpuState]:
    return (gpu for gpu in snapshot.gpus if schedulable(snapshot, gpu))


def _gpu_request_fit(gpu: GpuState, request: MigRequest | MpsRequest) -> tuple[int, int]:
    if isinstance(request, MigRequest):
        product = migfit.product_of(gpu)
        if gpu.mode != "mig" or product is None:
            return 0, 0
        profile = migfit.find_profile(product, request.profile)
        if profile is None:
            return 0, 0
        return gpu_profile_fit(gpu, product, profile)
    if not rules.request_valid(request):
        return 0, 0
    clients = sum(
        _clients(state, request.memory_mib, request.max_compute_percent)
        for _, state in mps_states(gpu)
    )
    return clients, clients


def _clients(state: rules.ShareState, memory_mib: int, compute: int | None) -> int:
    count = 0
    current = state
    while rules.mps_takes(current, memory_mib, compute):
        current = rules.with_client(current, memory_mib)
        count += 1
    return count


def gpu_profile_fit(gpu: GpuState, product: Product, profile: Profile) -> tuple[int, int]:
    """``(fits_now, fits_if_idle_reshaped)`` of a profile on a MIG GPU (memoised per product
    and layout)."""
    busy = tuple(Instance(p.profile_id, p.start) for p in gpu.partitions if p.occupied)
    idle = tuple(Instance(p.profile_id, p.start) for p in gpu.partitions if not p.occupied)
    fit: ProfileCapacity = migfit.memoised(
        product,
        ("capacity", profile.id, busy, idle),
        lambda: profile_capacity(product, profile.id, busy, idle),
    )
    return fit.fits_now, fit.fits_if_idle_reshaped


def _product_capacity(
    snapshot: FleetSnapshot,
    key: str,
    gpus: list[GpuState],
    mps_shapes: tuple[RequestShape, ...],
) -> ProductCapacity:
    ready = [gpu for gpu in gpus if schedulable(snapshot, gpu)]
    mig = [gpu for gpu in ready if gpu.mode == "mig"]
    return ProductCapacity(
        product_key=key,
        gpus=len(gpus),
        schedulable_gpus=len(ready),
        mig_gpus=len(mig),
        profiles=_profile_fits(key, mig),
        mps=_mps_fit(key, ready, mps_shapes),
        whole_free_gpus=sum(1 for gpu in ready if rules.whole_free(gpu, None)),
    )


def _profile_fits(key: str, mig: list[GpuState]) -> tuple[ProfileFit, ...]:
    if not mig:
        return ()
    listed = product_by_key(key) or migfit.product_of(mig[0])
    if listed is None:
        return ()
    fits = []
    for profile in listed.profiles:
        now = reshaped = 0
        for gpu in mig:
            product = migfit.product_of(gpu)
            own = migfit.find_profile(product, profile.id) if product is not None else None
            if product is not None and own is not None:
                gpu_now, gpu_reshaped = gpu_profile_fit(gpu, product, own)
                now += gpu_now
                reshaped += gpu_reshaped
        fits.append(ProfileFit(profile.name, profile.id, now, reshaped))
    return tuple(fits)


def _mps_fit(key: str, ready: list[GpuState], shapes: tuple[RequestShape, ...]) -> MpsFit:
    usable = tuple(s for s in shapes if not s.products or key in s.products)
    free = stranded = clients = 0
    for gpu in ready:
        for partition_id, state in mps_states(gpu):
            free += state[0]
            clients += max(0, state[1])
            if state[0] > 0 and _has_clients(gpu, partition_id) and not _any_takes(state, usable):
                stranded += state[0]
    return MpsFit(sum(1 for gpu in ready if gpu.mode == "mps"), free, stranded, clients)


def _has_clients(gpu: GpuState, partition_id: int | None) -> bool:
    if gpu.mode == "mps":
        return bool(gpu.mps_reservations)
    return any(p.occupied for p in gpu.partitions if p.id == partition_id)


def _any_takes(state: rules.ShareState, shapes: tuple[RequestShape, ...]) -> bool:
    return any(rules.mps_takes(state, s.memory_mib, s.compute_percent or None) for s in shapes)
