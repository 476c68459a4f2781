"""A frozen picture of the fleet as the placement engine sees it, and the requests it places.

The Django side builds these from rows (``fleet.allocations`` converters); the engine never reads
the database. MPS capacity is counted from reservations (ECS semantics), never from live use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fleet.mps import MpsRequest

GpuMode = Literal["dedicated", "mig", "mps"]

__all__ = [
    "FleetSnapshot",
    "GpuMode",
    "GpuState",
    "HostState",
    "MigPartition",
    "MigRequest",
    "MpsRequest",
    "PlacementRequest",
    "WholeGpuRequest",
]


@dataclass(frozen=True)
class HostState:
    """A host: placement skips unhealthy and cordoned (or draining) hosts."""

    id: int
    healthy: bool = True
    cordoned: bool = False


@dataclass(frozen=True)
class MigPartition:
    """An existing MIG GPU instance; ``occupied`` when a replica runs in it.

    ``allocation_id`` names the replica's allocation, where the caller knows it (defrag plans
    carry it through moves).
    """

    id: int
    profile_id: int
    start: int
    occupied: bool = False
    allocation_id: int | None = None


@dataclass(frozen=True)
class GpuState:
    """One GPU.

    Attributes:
        product_key: ``fleet.mig.catalog`` key (``h100-sxm5-80gb``); ``None`` when unknown.
        memory_mib: total device memory.
        mode: ``dedicated`` (whole GPU), ``mig`` or ``mps``.
        taken: a dedicated GPU already runs a whole-GPU workload.
        partitions: MIG instances (mode ``mig``).
        mps_reservations: the MPS clients placed (mode ``mps``).
        mps_max_clients: the daemon's client limit (``None``: the MPS default for a whole GPU).
        mps_reservation_ids: allocation ids of ``mps_reservations``, in the same order (optional;
            defrag plans fall back to the index).
    """

    id: int
    host_id: int
    product_key: str | None
    memory_mib: int
    mode: GpuMode = "dedicated"
    healthy: bool = True
    cordoned: bool = False
    taken: bool = False
    partitions: tuple[MigPartition, ...] = ()
    mps_reservations: tuple[MpsRequest, ...] = ()
    mps_max_clients: int | None = None
    mps_reservation_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class FleetSnapshot:
    """Hosts and GPUs; GPUs are ranked in this order when scores tie."""

    hosts: tuple[HostState, ...]
    gpus: tuple[GpuState, ...]

    def host(self, host_id: int) -> HostState | None:
        """The host with ``host_id``, if any."""
        return next((h for h in self.hosts if h.id == host_id), None)


@dataclass(frozen=True)
class MigRequest:
    """One replica in a MIG instance of ``profile`` (``3g.40gb``, ``mig-3g.40gb`` or an id)."""

    profile: str | int


@dataclass(frozen=True)
class WholeGpuRequest:
    """``count`` whole GPUs on one host."""

    count: int = 1


PlacementRequest = MigRequest | MpsRequest | WholeGpuRequest
