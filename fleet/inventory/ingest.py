"""Telemetry ingest in batches: many hosts' ticks stored with a handful of queries.

At 10,000 GPUs an ASGI process receives about a thousand telemetry messages a second. Handled
one by one, each cost a thread hop, a Redis round trip and, every few seconds, ORM queries; the
per-message overhead (not the work) was what saturated a 2-core server. So the live socket
collects ticks for a short window (:mod:`fleet.live.ingest`) and hands them here as one batch:

* **GPU maps** (UUID -> GPU id and MIG instance -> partition) are cached per host and refreshed
  for all stale hosts of a batch in two queries. They change only when the agent's own hello
  or ack changes what it observed (the socket then calls :func:`forget_host`), so the cache can
  be long (``FLEET_TELEMETRY_GPU_CACHE_SECONDS``, default 60 s, a safety net for the REST
  fallback, whose requests may reach any process).
* **Health** is never cached: one query per batch returns the batch's GPUs that are not
  healthy (the others are), so a live frame never shows a healed GPU as sick or the opposite.
* **The hot store** gets one pipeline for the whole batch (:meth:`TelemetryStore.record_many`).
* **Host.last_seen_at** gets one ``UPDATE … WHERE id IN (…)`` for the hosts not written for
  :func:`seen_every` seconds.

Live values are rounded here, once, to one decimal (frames stay small, browsers show no more);
``None`` stays ``None`` (NVML had no value).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils import timezone

from fleet.inventory.models import Gpu, GpuHealth, Host
from fleet.inventory.telemetry import GpuTick, HostRecord, get_store, trusted_ts
from fleet.partitioning.models import Partition, PartitionKind
from hostagent import protocol

# {uuid: (gpu id, {GPU instance id: partition id})}
GpuMap = dict[str, tuple[int, dict[int, int]]]
# A UUID the map does not know refetches the host's map, at most this often.
UNKNOWN_REFETCH_S = 1.0


@dataclass(frozen=True)
class Tick:
    """One telemetry message of one host, as received (``host_created`` keys the cache: a host
    deleted and created again with the same id must not reuse the old map)."""

    host_id: int
    host_created: float
    received_at: float
    telemetry: protocol.Telemetry


@dataclass
class Ingested:
    """What a batch produced: samples stored and the merged live values for browsers."""

    samples: int = 0
    ts: float = 0.0  # the newest agent timestamp in the batch
    host_ids: list[int] = field(default_factory=list)
    live: dict[str, dict[str, Any]] = field(default_factory=dict)  # str(gpu id) -> GpuLive


def cache_seconds() -> float:
    return float(getattr(settings, "FLEET_TELEMETRY_GPU_CACHE_SECONDS", 60.0))


def seen_every() -> float:
    """How stale ``Host.last_seen_at`` may get: a quarter of the offline limit, at most 5 s."""
    limit = float(settings.FLEET_HEARTBEAT_SECONDS) * int(settings.FLEET_OFFLINE_AFTER_MISSED)
    return max(0.0, min(5.0, limit / 4))


class _Maps:
    """The per-process GPU map cache (thread-safe: batches run in worker threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # (host id, created) -> (fetched at, map)
        self.maps: dict[tuple[int, float], tuple[float, GpuMap]] = {}
        # (host id, created) -> when this process last wrote the host's last_seen_at
        self.seen_written: dict[tuple[int, float], float] = {}

    def forget(self, host_id: int) -> None:
        with self.lock:
            for key in [k for k in self.maps if k[0] == host_id]:
                del self.maps[key]

    def clear(self) -> None:
        with self.lock:
            self.maps.clear()
            self.seen_written.clear()


_maps = _Maps()


def forget_host(host_id: int) -> None:
    """The host's GPUs or MIG instances changed (hello, ack): refetch its map on the next tick."""
    _maps.forget(host_id)


def forget_all() -> None:
    _maps.clear()


def _fresh_maps(ticks: Sequence[Tick], now: float) -> dict[int, GpuMap]:
    """The GPU map of every host in ``ticks``; stale or incomplete ones refetched together."""
    ttl = cache_seconds()
    wanted: dict[tuple[int, float], set[str]] = {}
    for tick in ticks:
        wanted.setdefault((tick.host_id, tick.host_created), set()).update(
            s["uuid"] for s in tick.telemetry["gpus"]
        )
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
    """Two queries for any number of hosts: their GPUs, and their GPUs' MIG partitions."""
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
        for instance in observed.get("mig_instances", []) or []:
            partition = by_place.get((instance.get("profile_id"), instance.get("start")))
            if partition is not None:
                instances[int(instance["gpu_instance_id"])] = partition
        out[gpu.host_id][gpu.uuid] = (gpu.pk, instances)
    return out


def _r(value: Any) -> Any:
    return round(value, 1) if isinstance(value, float) else value


@dataclass
class Prepared:
    """A batch turned into live values (:attr:`done`) and store records, not yet stored."""

    done: Ingested
    records: list[HostRecord]
    hosts: list[tuple[int, float]]
    received_at: float


def ingest(ticks: Sequence[Tick]) -> Ingested:
    """Store a batch of ticks (hot store, last seen) and return the merged live values."""
    prepared = prepare(ticks)
    persist(prepared)
    return prepared.done


def prepare(ticks: Sequence[Tick]) -> Prepared:
    """Map a batch's samples to GPUs and build its live values (two queries when the GPU maps
    are cached: browsers can be sent the values before they are stored).

    A GPU is looked up only within the host whose token sent the tick: a UUID of another
    host's GPU is ignored, never written."""
    result = Ingested()
    records: list[HostRecord] = []
    prepared = Prepared(result, records, [], time.time())
    if not ticks:
        return prepared
    maps = _fresh_maps(ticks, time.monotonic())
    host_ids = sorted({t.host_id for t in ticks})
    sick = dict(
        Gpu.objects.filter(host_id__in=host_ids)
        .exclude(health=GpuHealth.HEALTHY)
        .values_list("pk", "health")
    )
    healthy = GpuHealth.HEALTHY.value
    live = result.live
    for tick in ticks:
        gpu_map = maps.get(tick.host_id, {})
        ts = trusted_ts(float(tick.telemetry["ts"]), tick.received_at)
        ts_ms = int(ts * 1000)
        result.ts = max(result.ts, float(tick.telemetry["ts"]))
        gpu_ticks: list[GpuTick] = []
        for sample in tick.telemetry["gpus"]:
            known = gpu_map.get(sample["uuid"])
            if known is None:
                continue
            gpu_id, instances = known
            power_w = sample["power_mw"] / 1000 if sample["power_mw"] is not None else None
            gpu_ticks.append(
                GpuTick(
                    gpu_id=gpu_id,
                    utilization_percent=sample["utilization_gpu_percent"],
                    memory_used_mib=sample["memory_used_mib"],
                    temperature_c=sample["temperature_c"],
                    power_w=power_w,
                    sample=sample,  # type: ignore[arg-type]
                )
            )
            # GpuLive, plus the sample's agent time in ms (an int: browsers round floats).
            live[str(gpu_id)] = {
                "utilization_percent": _r(sample["utilization_gpu_percent"]),
                "memory_used_mib": _r(sample["memory_used_mib"]),
                "memory_total_mib": _r(sample["memory_total_mib"]),
                "temperature_c": _r(sample["temperature_c"]),
                "power_w": _r(power_w),
                "health": sick.get(gpu_id, healthy),
                "partitions": {
                    str(instances[m["gpu_instance_id"]]): {
                        "utilization_percent": _r(m["utilization_percent"]),
                        "memory_used_mib": _r(m["memory_used_mib"]),
                    }
                    for m in sample["mig"]
                    if m["gpu_instance_id"] in instances
                },
                "ts_ms": ts_ms,
            }
        records.append(HostRecord(tick.host_id, ts, tick.received_at, gpu_ticks))
        result.samples += len(gpu_ticks)
    result.host_ids = host_ids
    prepared.hosts = sorted({(t.host_id, t.host_created) for t in ticks})
    return prepared


def persist(prepared: Prepared) -> None:
    """Store a prepared batch: one hot-store pipeline, one ``last_seen_at`` update at most."""
    if prepared.records:
        get_store().record_many(prepared.records)
    if prepared.hosts:
        _touch(prepared.hosts, prepared.received_at)


def _touch(hosts: list[tuple[int, float]], now: float) -> None:
    """``last_seen_at`` for the hosts this process has not written for :func:`seen_every`."""
    every = seen_every()
    with _maps.lock:
        due = [h for h in hosts if now - _maps.seen_written.get(h, 0.0) >= every]
        if len(_maps.seen_written) > 100_000:
            _maps.seen_written.clear()
        for h in due:
            _maps.seen_written[h] = now
    if due:
        Host.objects.filter(pk__in=[h[0] for h in due]).update(last_seen_at=timezone.now())
