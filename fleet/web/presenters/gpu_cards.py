"""A GPU card: its live values, its MIG slices on the memory-slice grid, its MPS shares or whole
GPU, and the signature that says when it must be redrawn."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from fleet.allocations.models import Allocation, AllocationState
from fleet.core.ratelimit import OncePer, cut
from fleet.inventory.models import Gpu, GpuHealth, Host, HostStatus, SharingMode
from fleet.mig import Product
from fleet.partitioning import converters
from fleet.partitioning.models import Partition, PartitionKind
from fleet.web.presenters.formats import heat_bucket
from fleet.web.presenters.formats import number as _number

logger = logging.getLogger(__name__)

UNHEALTHY = (GpuHealth.UNHEALTHY, GpuHealth.LOST)
"""The health states a card flags and the summary counts as unhealthy."""


@dataclass(frozen=True)
class Live:
    """Latest telemetry of one GPU; ``None`` wherever NVML had no value."""

    utilization_percent: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    partitions: dict[str, dict[str, float | None]] = field(default_factory=dict)

    @classmethod
    def from_raw(cls, raw: Any) -> Live:
        """Reads the live-event shape (``fleet.core.events.GpuLive``) and the agent's own sample
        shape (``utilization_gpu_percent``, ``power_mw``), whichever ``last_telemetry`` holds."""
        if not isinstance(raw, dict):
            return cls()
        power = _number(raw.get("power_w"))
        if power is None and _number(raw.get("power_mw")) is not None:
            power = float(raw["power_mw"]) / 1000
        util = raw.get("utilization_percent", raw.get("utilization_gpu_percent"))
        parts = raw.get("partitions")
        return cls(
            utilization_percent=_number(util),
            memory_used_mib=_number(raw.get("memory_used_mib")),
            memory_total_mib=_number(raw.get("memory_total_mib")),
            temperature_c=_number(raw.get("temperature_c")),
            power_w=power,
            partitions=parts if isinstance(parts, dict) else {},
        )

    def partition(self, partition_id: int) -> dict[str, float | None]:
        found = self.partitions.get(str(partition_id))
        return found if isinstance(found, dict) else {}


@dataclass(frozen=True)
class AllocationView:
    id: int
    deployment_id: int
    name: str
    replica: int
    memory_mib: int
    compute_percent: int | None
    pending: bool
    width_percent: float = 0.0
    workload_state: str = "none"
    releasing: bool = False
    workload_message: str = ""

    @property
    def label(self) -> str:
        return f"{self.name}[{self.replica}]"

    @property
    def status(self) -> str:
        """What the slice shows: the workload's state, ``stopping`` while it releases."""
        if self.releasing:
            return "stopping"
        return "" if self.workload_state == "none" else self.workload_state


@dataclass(frozen=True)
class SliceView:
    """One MIG instance at its placement on the memory-slice grid."""

    partition_id: int
    profile: str
    start: int
    size: int
    memory_mib: int
    allocations: tuple[AllocationView, ...]
    pending: bool
    utilization_percent: float | None
    memory_used_mib: float | None
    mps_enabled: bool

    @property
    def heat(self) -> str:
        return heat_bucket(self.utilization_percent)

    slice_count: int = 8  # its GPU's memory slices: how wide the card draws it

    @property
    def short(self) -> str:
        """The profile as the slice can show it: ``2g`` (``2g+me``) where it spans a quarter of
        the card or less (its full name is in the tooltip), else the whole name."""
        if self.size * 4 > max(self.slice_count, 1):
            return self.profile
        compute = self.profile.split(".")[0]
        return f"{compute}+me" if self.profile.endswith("+me") else compute

    @property
    def column(self) -> str:
        return f"{self.start + 1} / span {self.size}"


@dataclass(frozen=True)
class GpuCard:
    id: int
    host_id: int
    host_name: str
    host_status: str
    index: int
    uuid: str
    product_name: str
    mode: str
    health: str
    health_reason: str
    cordoned: bool
    cordon_reason: str
    memory_mib: int
    applying: bool
    live: Live
    slice_count: int
    slices: tuple[SliceView, ...]
    free_cells: tuple[int, ...]
    whole_partition_id: int | None
    shares: tuple[AllocationView, ...]
    compute_reserved_percent: int
    memory_reserved_mib: int
    mps_enabled: bool
    allocation_count: int = 0

    @property
    def product_short(self) -> str:
        return self.product_name.removeprefix("NVIDIA ").strip()

    @property
    def unhealthy(self) -> bool:
        return self.health in UNHEALTHY

    @property
    def offline(self) -> bool:
        return self.host_status == HostStatus.OFFLINE

    @property
    def heat(self) -> str:
        return heat_bucket(self.live.utilization_percent)

    @property
    def memory_total_mib(self) -> float:
        return self.live.memory_total_mib or float(self.memory_mib)

    @property
    def memory_reserved_percent(self) -> float:
        return round(100 * self.memory_reserved_mib / self.memory_mib, 1) if self.memory_mib else 0

    @property
    def is_mig(self) -> bool:
        return self.mode == SharingMode.MIG

    @property
    def is_mps(self) -> bool:
        return self.mode == SharingMode.MPS

    @property
    def free(self) -> bool:
        """No allocation on the GPU: the meaning of the ``free`` GPU filter
        (``fleet.inventory.filters``), which the browser applies to ``data-free``."""
        return self.allocation_count == 0

    @property
    def deployments(self) -> list[str]:
        names = {a.name for s in self.slices for a in s.allocations}
        names |= {a.name for a in self.shares}
        return sorted(names)

    @property
    def search_text(self) -> str:
        parts = [self.host_name, f"gpu{self.index}", self.product_name, self.uuid, self.mode]
        parts += [s.profile for s in self.slices] + self.deployments
        return " ".join(parts).lower()

    @property
    def signature(self) -> str:
        """Changes whenever the card's structure does (telemetry excluded: JS paints that)."""
        state = repr(
            (
                self.host_status,
                self.mode,
                self.health,
                self.health_reason,
                self.cordoned,
                self.cordon_reason,
                self.applying,
                self.mps_enabled,
                [
                    (s.partition_id, s.profile, s.start, s.size, s.pending, s.allocations)
                    for s in self.slices
                ],
                self.shares,
            )
        )
        return hashlib.blake2s(state.encode(), digest_size=6).hexdigest()


def _allocation_view(allocation: Allocation, whole_memory_mib: int) -> AllocationView:
    width = 100 * allocation.memory_mib / whole_memory_mib if whole_memory_mib else 0.0
    return AllocationView(
        id=allocation.pk,
        deployment_id=allocation.deployment_id,
        name=allocation.deployment.name,
        replica=allocation.replica,
        memory_mib=allocation.memory_mib,
        compute_percent=allocation.compute_percent,
        pending=allocation.state == AllocationState.PENDING,
        width_percent=round(min(100.0, width), 2),
        workload_state=allocation.workload_state,
        releasing=allocation.state == AllocationState.RELEASING,
        workload_message=allocation.workload_message,
    )


def _product(gpu: Gpu) -> Product | None:
    return converters.product_of(gpu)


def partition_of_instance(gpu: Gpu, partitions: list[Partition]) -> dict[Any, int]:
    """NVML GPU-instance id -> partition id, through the instances the agent observed."""
    observed = gpu.observed.get("mig_instances") if isinstance(gpu.observed, dict) else None
    by_start = {p.start: p.pk for p in partitions if p.kind == PartitionKind.MIG}
    found: dict[Any, int] = {}
    for instance in observed or []:
        if isinstance(instance, dict) and instance.get("start") in by_start:
            found[instance.get("gpu_instance_id")] = by_start[instance["start"]]
    return found


def _live(gpu: Gpu, partitions: list[Partition], sample: dict[str, Any] | None) -> Live:
    """The latest sample; MIG values keyed by partition (the agent keys them by GPU instance)."""
    raw = sample if sample is not None else gpu.last_telemetry
    raw = raw if isinstance(raw, dict) else {}
    live = Live.from_raw(raw)
    if live.partitions or not isinstance(raw.get("mig"), list):
        return live
    owners = partition_of_instance(gpu, partitions)
    by_partition = {
        str(owners[m.get("gpu_instance_id")]): {
            "utilization_percent": _number(m.get("utilization_percent")),
            "memory_used_mib": _number(m.get("memory_used_mib")),
        }
        for m in raw["mig"]
        if isinstance(m, dict) and m.get("gpu_instance_id") in owners
    }
    return replace(live, partitions=by_partition)


def gpu_card(
    gpu: Gpu,
    *,
    applying: bool = False,
    host: Host | None = None,
    sample: dict[str, Any] | None = None,
) -> GpuCard:
    """The card of one GPU; ``gpu`` comes from :func:`fleet.web.selectors.fleet_gpus` and
    ``sample`` from :func:`fleet.web.selectors.latest_samples` (else the row's checkpoint)."""
    host = host or gpu.host
    partitions: list[Partition] = list(gpu.partitions.all())
    live = _live(gpu, partitions, sample)
    mig_parts = [p for p in partitions if p.kind == PartitionKind.MIG]
    whole = next((p for p in partitions if p.kind == PartitionKind.GPU), None)
    product = _product(gpu) if gpu.mode == SharingMode.MIG else None
    slice_count = product.memory_slice_count if product is not None else 0
    slices = tuple(
        replace(_slice_view(p, live, applying, gpu.memory_mib), slice_count=slice_count)
        for p in mig_parts
    )
    occupied = {i for s in slices for i in range(s.start, min(s.start + s.size, slice_count))}
    shares: tuple[AllocationView, ...] = ()
    if whole is not None and gpu.mode != SharingMode.MIG:
        shares = tuple(_allocation_view(a, gpu.memory_mib) for a in whole.allocations.all())
    return GpuCard(
        id=gpu.pk,
        host_id=gpu.host_id,
        host_name=host.name,
        host_status=host.status,
        index=gpu.index,
        uuid=gpu.uuid,
        product_name=gpu.product_name,
        mode=gpu.mode,
        health=gpu.health,
        health_reason=gpu.health_reason,
        cordoned=gpu.cordoned,
        cordon_reason=gpu.cordon_reason,
        memory_mib=gpu.memory_mib,
        applying=applying,
        live=live,
        slice_count=slice_count,
        slices=slices,
        free_cells=tuple(i for i in range(slice_count) if i not in occupied),
        whole_partition_id=whole.pk if whole is not None else None,
        shares=shares,
        compute_reserved_percent=min(100, sum(a.compute_percent or 0 for a in shares)),
        memory_reserved_mib=sum(a.memory_mib for a in shares),
        mps_enabled=bool(whole and whole.mps_enabled),
        allocation_count=sum(len(p.allocations.all()) for p in partitions),
    )


def safe_gpu_card(
    gpu: Gpu,
    *,
    applying: bool = False,
    host: Host | None = None,
    sample: dict[str, Any] | None = None,
) -> GpuCard:
    """:func:`gpu_card`, or, if this GPU's stored state cannot be drawn, a plain card that says
    so: one GPU's bad data never costs anyone the rest of the page."""
    try:
        return gpu_card(gpu, applying=applying, host=host, sample=sample)
    except Exception as error:
        if _card_warned(gpu.pk):
            logger.warning("GPU %s cannot be drawn: %s", gpu.pk, cut(error))
    host = host or gpu.host
    return GpuCard(
        id=gpu.pk,
        host_id=gpu.host_id,
        host_name=host.name,
        host_status=host.status,
        index=gpu.index,
        uuid=gpu.uuid,
        product_name=gpu.product_name,
        mode=gpu.mode,
        health=gpu.health,
        health_reason=gpu.health_reason or "its stored state cannot be drawn",
        cordoned=gpu.cordoned,
        cordon_reason=gpu.cordon_reason,
        memory_mib=gpu.memory_mib,
        applying=applying,
        live=Live(),
        slice_count=0,
        slices=(),
        free_cells=(),
        whole_partition_id=None,
        shares=(),
        compute_reserved_percent=0,
        memory_reserved_mib=0,
        mps_enabled=False,
    )


_card_warned = OncePer(60.0)


def _slice_view(partition: Partition, live: Live, applying: bool, gpu_memory: int) -> SliceView:
    values = live.partition(partition.pk)
    return SliceView(
        partition_id=partition.pk,
        profile=partition.profile_name or f"profile {partition.profile_id}",
        start=partition.start,
        size=partition.size,
        memory_mib=partition.memory_mib,
        allocations=tuple(_allocation_view(a, gpu_memory) for a in partition.allocations.all()),
        pending=applying and not partition.uuid,
        utilization_percent=_number(values.get("utilization_percent")),
        memory_used_mib=_number(values.get("memory_used_mib")),
        mps_enabled=partition.mps_enabled,
    )
