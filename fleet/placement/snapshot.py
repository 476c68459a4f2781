"""A frozen picture of the fleet as the placement engine sees it, and the requests it places.

The Django side builds these from rows (``fleet.allocations`` converters); the engine never reads
the database. MPS capacity is counted from reservations (ECS semantics), never from live use.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, Literal

from fleet.mig import Product
from fleet.mps import MpsDevice, MpsPolicy, MpsRequest

GpuMode = Literal["dedicated", "mig", "mps"]

__all__ = [
    "Demand",
    "FleetSnapshot",
    "GpuMode",
    "GpuState",
    "HostGroup",
    "HostState",
    "MigPartition",
    "MigRequest",
    "MpsRequest",
    "MpsShare",
    "PlacementRequest",
    "WholeGpuRequest",
]


@dataclass(frozen=True)
class HostState:
    """A host: placement skips unhealthy and cordoned (or draining) hosts.

    ``cpu_free_milli`` and ``memory_free_mib``: host CPU and memory not yet taken, where the
    caller tracks them (the trace benchmark does); ``None``, the product's case, means not
    tracked, and no request is refused for them. ``runtime``: what the host's agent runs
    workloads with (``docker``, ``process``, ``none``), checked against
    :attr:`Demand.runtimes`; ``None``: not tracked (the benchmarks). ``name``: for messages.
    ``labels``: the host's labels as sorted ``(key, value)`` pairs, checked against
    :attr:`Demand.host_labels`. ``process_runtime``: the host's agent runs process workloads
    (an operator started it with ``--allow-process-runtime``), checked against
    :attr:`Demand.process_runtime`; ``None``: not tracked. ``reserved_for``: the teams the host
    is reserved for, as sorted ``(team id, slug)`` pairs (a taint that only their deployments
    tolerate), checked against :attr:`Demand.team`; empty: every team's replicas.
    """

    id: int
    healthy: bool = True
    cordoned: bool = False
    cpu_free_milli: int | None = None
    memory_free_mib: int | None = None
    runtime: str | None = None
    name: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    process_runtime: bool | None = None
    reserved_for: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class MpsShare:
    """What one MPS daemon offers: its device's capacity, the operator's policy, and the clients
    already placed (``reservation_ids``: their allocations, where the caller knows them).
    ``blocked`` when a whole-partition workload holds the device instead of MPS clients."""

    device: MpsDevice
    policy: MpsPolicy | None = None
    reservations: tuple[MpsRequest, ...] = ()
    reservation_ids: tuple[int, ...] = ()
    blocked: bool = False


@dataclass(frozen=True)
class MigPartition:
    """An existing MIG GPU instance; ``occupied`` when a replica (or an MPS client) runs in it.

    ``allocation_id`` names the replica's allocation, where the caller knows it (defrag plans
    carry it through moves). ``mps``: the instance runs an MPS daemon, and MPS requests may be
    placed in it.
    """

    id: int
    profile_id: int
    start: int
    occupied: bool = False
    allocation_id: int | None = None
    mps: MpsShare | None = None


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
        product: the product with the placements its agent read from NVML (they override the
            catalog); ``None``: the catalog's entry for ``product_key``.
        whole_partition_id: the partition of the whole GPU (dedicated or MPS), when known.
        mps_policy: the whole GPU's MPS daemon policy (mode ``mps``).
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
    product: Product | None = None
    whole_partition_id: int | None = None
    mps_policy: MpsPolicy | None = None

    @property
    def memo(self) -> dict[Any, Any]:
        """The engine's memo of pure functions of this (frozen) state; it dies with the state."""
        memo: dict[Any, Any] | None = self.__dict__.get("_memo")
        if memo is None:
            memo = self.__dict__["_memo"] = {}
        return memo

    def whole_mps_device(self) -> MpsDevice:
        """The capacity of the whole GPU's MPS daemon (mode ``mps``)."""
        return _whole_gpu_device(self.memory_mib, self.mps_max_clients)

    def whole_mps(self) -> MpsShare:
        """The whole GPU's MPS daemon (mode ``mps``) as a share like any other."""
        return MpsShare(
            self.whole_mps_device(),
            self.mps_policy,
            self.mps_reservations,
            self.mps_reservation_ids,
        )


@lru_cache(maxsize=256)
def _whole_gpu_device(memory_mib: int, max_clients: int | None) -> MpsDevice:
    if max_clients is not None:
        return MpsDevice(memory_mib, max(1, max_clients))
    return MpsDevice.whole_gpu(memory_mib)


@dataclass(frozen=True)
class HostGroup:
    """One host and its GPUs, with their positions in the snapshot (the tie order).

    ``host`` is ``None`` when the snapshot lacks the GPUs' host. ``memo`` caches the engine's
    pure results for this group; :meth:`FleetSnapshot.with_changes` keeps the groups it does not
    touch, so their memos survive from one snapshot to the next.
    """

    host_id: int
    host: HostState | None
    gpus: tuple[GpuState, ...]
    positions: tuple[int, ...]
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class FleetSnapshot:
    """Hosts and GPUs; GPUs are ranked in this order when scores tie."""

    hosts: tuple[HostState, ...]
    gpus: tuple[GpuState, ...]

    @cached_property
    def _host_positions(self) -> dict[int, int]:
        positions: dict[int, int] = {}
        for position, host in enumerate(self.hosts):
            positions.setdefault(host.id, position)
        return positions

    @cached_property
    def _gpu_positions(self) -> dict[int, int]:
        positions: dict[int, int] = {}
        for position, gpu in enumerate(self.gpus):
            positions.setdefault(gpu.id, position)
        return positions

    @cached_property
    def host_groups(self) -> tuple[HostGroup, ...]:
        """GPUs grouped by host, in the order of each host's first GPU in ``gpus``."""
        members: dict[int, list[int]] = {}
        for position, gpu in enumerate(self.gpus):
            members.setdefault(gpu.host_id, []).append(position)
        return tuple(self._group(host_id, positions) for host_id, positions in members.items())

    @cached_property
    def _group_index(self) -> dict[int, int]:
        return {group.host_id: k for k, group in enumerate(self.host_groups)}

    def _group(self, host_id: int, positions: Iterable[int]) -> HostGroup:
        kept = tuple(positions)
        return HostGroup(host_id, self.host(host_id), tuple(self.gpus[p] for p in kept), kept)

    def host(self, host_id: int) -> HostState | None:
        """The host with ``host_id``, if any."""
        position = self._host_positions.get(host_id)
        return None if position is None else self.hosts[position]

    def gpu(self, gpu_id: int) -> GpuState | None:
        """The GPU with ``gpu_id``, if any."""
        position = self._gpu_positions.get(gpu_id)
        return None if position is None else self.gpus[position]

    def group(self, host_id: int) -> HostGroup | None:
        """The host group of ``host_id``, if the snapshot has GPUs on it."""
        index = self._group_index.get(host_id)
        return None if index is None else self.host_groups[index]

    def with_changes(
        self, *, hosts: Iterable[HostState] = (), gpus: Iterable[GpuState] = ()
    ) -> FleetSnapshot:
        """This snapshot with ``hosts`` and ``gpus`` replacing those of the same ids, in place.

        The indexes and the host groups not touched carry over (with their memos), so a caller
        that applies one placement at a time pays for what changed, not for the fleet.

        Raises:
            KeyError: for a host or GPU id the snapshot does not have.
        """
        new_hosts = list(self.hosts)
        touched: set[int] = set()
        for host in hosts:
            new_hosts[self._host_positions[host.id]] = host
            touched.add(host.id)
        new_gpus = list(self.gpus)
        positions = self._gpu_positions
        for gpu in gpus:
            position = positions[gpu.id]
            if new_gpus[position].host_id != gpu.host_id:
                raise KeyError(f"GPU {gpu.id} cannot move to host {gpu.host_id}")
            new_gpus[position] = gpu
            touched.add(gpu.host_id)
        changed = FleetSnapshot(tuple(new_hosts), tuple(new_gpus))
        cache = changed.__dict__
        cache["_gpu_positions"] = positions
        cache["_host_positions"] = self._host_positions
        if "host_groups" in self.__dict__:
            groups = list(self.host_groups)
            for host_id in touched:
                index = self._group_index.get(host_id)
                if index is not None:
                    groups[index] = changed._group(host_id, groups[index].positions)
            cache["host_groups"] = tuple(groups)
            cache["_group_index"] = self._group_index
        return changed


@dataclass(frozen=True)
class MigRequest:
    """One replica in a MIG instance of ``profile`` (``3g.40gb``, ``mig-3g.40gb`` or an id)."""

    profile: str | int


@dataclass(frozen=True)
class WholeGpuRequest:
    """``count`` whole GPUs on one host."""

    count: int = 1


@dataclass(frozen=True)
class Demand:
    """What a replica needs beside its GPU share (optional; the product sets the host facts,
    never ``cpu_milli`` and ``host_memory_mib``). ``None`` instead of a demand asks nothing of
    a host, a reservation included (free capacity counts reserved hosts): the product gives
    every deployment's replicas a demand with its ``team``.

    Attributes:
        cpu_milli: host CPU, checked against :attr:`HostState.cpu_free_milli` where tracked.
        host_memory_mib: host memory, checked against :attr:`HostState.memory_free_mib`.
        products: the GPU products it may run on (``GpuState.product_key``); empty: any.
        runtimes: the host runtimes that can run its workload (:attr:`HostState.runtime`);
            empty: any.
        workload: the workload's own runtime (``container``, ``process``), for messages.
        process_runtime: it runs on the host itself (a process), so only on hosts whose agent
            allows process workloads (:attr:`HostState.process_runtime`).
        host_labels: ``(key, value)`` pairs every host it runs on must carry
            (:attr:`HostState.labels`); empty: any host.
        team: the deployment's team (id): a host reserved for other teams refuses it
            (:attr:`HostState.reserved_for`); ``None``: no team, which no reserved host takes.
        port: a port the workload listens on in its host's network (its health check's), or
            0; ``avoid_hosts``: the hosts that already run a copy of it, where a second copy
            could not bind that port.
    """

    cpu_milli: int = 0
    host_memory_mib: int = 0
    products: tuple[str, ...] = ()
    runtimes: tuple[str, ...] = ()
    workload: str = ""
    process_runtime: bool = False
    host_labels: tuple[tuple[str, str], ...] = ()
    team: int | None = None
    port: int = 0
    avoid_hosts: frozenset[int] = frozenset()


PlacementRequest = MigRequest | MpsRequest | WholeGpuRequest
