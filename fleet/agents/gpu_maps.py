"""Each host's GPU map for telemetry: UUID -> GPU id, MIG instance -> partition, and the replicas on
each GPU, cached per host and process and refetched for all stale hosts of a batch in three
queries; and a replica's values read from its GPU's tick (:func:`replica_ticks`).

The maps change only when the agent's own hello or ack changes what it observed (a replica placed
or released is a new generation the agent acks; the socket then calls :func:`forget_host`), so
the cache can be long (``FLEET_TELEMETRY_GPU_CACHE_SECONDS``, default 60 s, a safety net for
the REST fallback, whose requests may reach any process).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from fleet.allocations.models import Allocation, RequestKind
from fleet.inventory.models import Gpu
from fleet.inventory.telemetry import ReplicaTick
from fleet.partitioning.models import Partition, PartitionKind
from hostagent import protocol


@dataclass(frozen=True, slots=True)
class GpuReplicas:
    """The replicas on one GPU, as telemetry measures them: a MIG replica by its instance, the
    others (MPS shares, a whole GPU) by the memory of the processes the agent attributes to
    them, a whole-GPU replica also by the GPU's utilisation."""

    by_instance: dict[int, int]  # MIG GPU instance id -> allocation id
    by_processes: frozenset[int]  # allocation ids
    whole: frozenset[int]  # allocation ids holding the whole GPU (kind ``gpu``)


NO_REPLICAS = GpuReplicas({}, frozenset(), frozenset())


# {uuid: (gpu id, {GPU instance id: partition id}, its replicas)}
GpuMap = dict[str, tuple[int, dict[int, int], GpuReplicas]]


# A UUID the map does not know refetches the host's map, at most this often.
UNKNOWN_REFETCH_S = 1.0


def cache_seconds() -> float:
    return float(getattr(settings, "FLEET_TELEMETRY_GPU_CACHE_SECONDS", 60.0))


class _Maps:
    """The per-process GPU map cache (thread-safe: batches run in worker threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # (host id, created) -> (fetched at, map)
        self.maps: dict[tuple[int, float], tuple[float, GpuMap]] = {}

    def forget(self, host_id: int) -> None:
        with self.lock:
            for key in [k for k in self.maps if k[0] == host_id]:
                del self.maps[key]

    def clear(self) -> None:
        with self.lock:
            self.maps.clear()


_maps = _Maps()


def forget_host(host_id: int) -> None:
    """The host's GPUs or MIG instances changed (hello, ack): refetch its map on the next tick."""
    _maps.forget(host_id)


def forget_maps() -> None:
    _maps.clear()


def fresh_maps(wanted: Mapping[tuple[int, float], set[str]], now: float) -> dict[int, GpuMap]:
    """The GPU map of every host in ``wanted`` (``(host id, created)`` -> the GPU UUIDs its ticks
    name); stale or incomplete ones refetched together."""
    ttl = cache_seconds()
    out: dict[int, GpuMap] = {}
    stale: list[tuple[int, float]] = []
    with _maps.lock:
        for key, uuids in wanted.items():
            cached = _maps.maps.get(key)
            if cached is not None:
                age = now - cached[0]
                complete = uuids <= cached[1].keys()
                if age < ttl and (complete or age < UNKNOWN_REFETCH_S):
                    out[key[0]] = cached[1]
                    continue
            stale.append(key)
    if stale:
        fetched = _fetch_maps([k[0] for k in stale])
        with _maps.lock:
            if len(_maps.maps) > 100_000:
                _maps.maps.clear()
            for key in stale:
                found = fetched.get(key[0], {})
                _maps.maps[key] = (now, found)
                out[key[0]] = found
    return out


def _fetch_maps(host_ids: list[int]) -> dict[int, GpuMap]:
    """Three queries for any number of hosts: their GPUs, their GPUs' MIG partitions, and the
    replicas on those GPUs."""
    gpus = list(Gpu.objects.filter(host_id__in=host_ids).only("pk", "uuid", "host_id", "observed"))
    places: dict[int, dict[tuple[int | None, int], int]] = {}
    for gpu_id, profile_id, start, pk in Partition.objects.filter(
        gpu__host_id__in=host_ids, kind=PartitionKind.MIG
    ).values_list("gpu_id", "profile_id", "start", "pk"):
        places.setdefault(gpu_id, {})[(profile_id, start)] = pk
    out: dict[int, GpuMap] = {h: {} for h in host_ids}
    for gpu in gpus:
        observed = gpu.observed if isinstance(gpu.observed, dict) else {}
        by_place = places.get(gpu.pk, {})
        instances: dict[int, int] = {}
        listed = observed.get("mig_instances")
        for instance in listed if isinstance(listed, list) else []:
            if not isinstance(instance, dict) or not isinstance(
                instance.get("gpu_instance_id"), int
            ):
                continue  # stored before the protocol bounded it: read what can be read
            place: Any = (instance.get("profile_id"), instance.get("start"))
            partition = by_place.get(place)
            if partition is not None:
                instances[instance["gpu_instance_id"]] = partition
        out[gpu.host_id][gpu.uuid] = (gpu.pk, instances, NO_REPLICAS)
    replicas = _fetch_replicas(host_ids)
    for host_map in out.values():
        for uuid, (gpu_id, instances, _) in host_map.items():
            found = replicas.get(gpu_id)
            if found is not None:
                host_map[uuid] = (gpu_id, instances, _gpu_replicas(instances, *found))
    return out


# gpu id -> ([(allocation id, partition id)] of MIG replicas, [(allocation id, kind)] of others)
_Found = dict[int, tuple[list[tuple[int, int]], list[tuple[int, str]]]]


def _fetch_replicas(host_ids: list[int]) -> _Found:
    """Every replica on the hosts' GPUs, releasing ones too (their workload still runs)."""
    found: _Found = {}
    rows = Allocation.objects.filter(gpu__host_id__in=host_ids).values_list(
        "pk", "gpu_id", "kind", "partition_id"
    )
    for pk, gpu_id, kind, partition_id in rows:
        mig, others = found.setdefault(gpu_id, ([], []))
        if kind == RequestKind.MIG:
            mig.append((pk, partition_id))
        else:
            others.append((pk, kind))
    return found


def _gpu_replicas(
    instances: dict[int, int], mig: list[tuple[int, int]], others: list[tuple[int, str]]
) -> GpuReplicas:
    instance_of = {partition: gi for gi, partition in instances.items()}
    return GpuReplicas(
        by_instance={instance_of[p]: pk for pk, p in mig if p in instance_of},
        by_processes=frozenset(pk for pk, _ in others),
        whole=frozenset(pk for pk, kind in others if kind == RequestKind.GPU),
    )


def replica_ticks(sample: protocol.GpuTelemetry, replicas: GpuReplicas) -> list[ReplicaTick]:
    """The values of the replicas on one GPU in one tick; ``None`` where the tick has none.

    A MIG replica: its instance's utilisation (GPM, Hopper and later; ``None`` elsewhere) and
    memory. An MPS share or a whole GPU: the memory of the processes the agent attributes to
    it (``None`` when no attributed process reports any), and for a whole GPU the GPU's
    utilisation; NVML gives no utilisation per MPS client in our protocol (``None``). A process
    naming a replica that is not on this GPU is ignored (the agent is not trusted with that).
    """
    out: list[ReplicaTick] = []
    if replicas.by_instance:
        mig = {m["gpu_instance_id"]: m for m in sample["mig"]}
        for gi, allocation_id in replicas.by_instance.items():
            m = mig.get(gi)
            util = m["utilization_percent"] if m is not None else None
            out.append(ReplicaTick(allocation_id, util, m["memory_used_mib"] if m else None))
    if replicas.by_processes:
        memory: dict[int, float] = {}
        for process in sample["processes"]:
            owner = process.get("allocation_id")
            used = process["used_memory_mib"]
            if owner is not None and used is not None and owner in replicas.by_processes:
                memory[owner] = memory.get(owner, 0.0) + used
        gpu_util = sample["utilization_gpu_percent"]
        for allocation_id in replicas.by_processes:
            util = gpu_util if allocation_id in replicas.whole else None
            out.append(ReplicaTick(allocation_id, util, memory.get(allocation_id)))
    return out
