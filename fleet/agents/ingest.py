"""Telemetry ingest in batches: many hosts' ticks stored with a handful of queries.

At 10,000 GPUs an ASGI process receives about a thousand telemetry messages a second. Handled
one by one, each cost a thread hop, a Redis round trip and, every few seconds, ORM queries; the
per-message overhead (not the work) was what saturated a 2-core server. So the live socket
collects ticks for a short window (:mod:`fleet.live.ingest`) and hands them here as one batch:

* **GPU maps** (UUID -> GPU id, MIG instance -> partition, and the replicas on each GPU) are
  cached per host and refreshed for all stale hosts of a batch in three queries
  (:mod:`fleet.agents.gpu_maps`).
* **Health** is never cached: one query per batch returns the batch's GPUs that are not
  healthy (the others are), so a live frame never shows a healed GPU as sick or the opposite.
* **The replicas' own metrics** (``replica_metrics``, read by the agent from the workloads'
  Prometheus endpoints) are kept as each replica's latest reading, for its own host's replicas
  only (:mod:`fleet.inventory.telemetry.metrics`).
* **Replicas** are measured from the same tick
  (:func:`~fleet.agents.gpu_maps.replica_ticks`): no query, a few
  dictionary lookups per GPU that holds replicas, nothing for the others.
* **The hot store** gets one pipeline for the whole batch (:meth:`TelemetryStore.record_many`).
* **Host.last_seen_at** gets one ``UPDATE … WHERE id IN (…)`` for the hosts not written for
  a few seconds, whatever the hot store does (it is written first), and the same hosts come
  back from ``offline`` (:mod:`fleet.agents.last_seen`): any message of an agent, not only a
  new ``hello``, says the host is there.
* **Isolation.** One host's tick that cannot be mapped or stored is dropped alone (logged once
  a minute per host); every other host's ticks and heartbeat go through.

Live values are rounded here, once, to one decimal (frames stay small, browsers show no more);
``None`` stays ``None`` (NVML had no value).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from fleet.agents.gpu_maps import NO_REPLICAS, GpuMap, forget_maps, fresh_maps, replica_ticks
from fleet.agents.last_seen import forget_written, hosts_touch
from fleet.core.ratelimit import OncePer, cut
from fleet.inventory.models import Gpu, GpuHealth
from fleet.inventory.telemetry import GpuTick, HostRecord, ReplicaTick, get_store, trusted_ts
from fleet.inventory.telemetry.metrics import ReplicaReading
from hostagent import protocol

logger = logging.getLogger(__name__)
_warn_once = OncePer(60.0)


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
    # per host: [host id, sum of its GPUs' utilisation, how many had a value, GPUs]
    hosts_util: list[list[float | int]] = field(default_factory=list)


BLOB_GPUS = 1000
"""GPUs per pre-encoded piece of a live message (a browser frame splices whole pieces)."""


def live_blobs(done: Ingested) -> tuple[list[bytes], list[int]]:
    """The batch's live values as JSON objects of at most :data:`BLOB_GPUS` GPUs each, encoded
    once here (in the telemetry thread) for every browser, and their GPU ids."""
    items = list(done.live.items())
    blobs = [orjson.dumps(dict(items[i : i + BLOB_GPUS])) for i in range(0, len(items), BLOB_GPUS)]
    return blobs, [int(k) for k, _ in items]


def forget_all() -> None:
    """Forget what this process caches: the GPU maps and when it last wrote each host's
    ``last_seen_at``."""
    forget_maps()
    forget_written()


def _r(value: Any) -> Any:
    return round(value, 1) if value.__class__ is float else value


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
    wanted: dict[tuple[int, float], set[str]] = {}
    for tick in ticks:
        wanted.setdefault((tick.host_id, tick.host_created), set()).update(
            s["uuid"] for s in tick.telemetry["gpus"]
        )
    maps = fresh_maps(wanted, time.monotonic())
    host_ids = sorted({t.host_id for t in ticks})
    sick = dict(
        Gpu.objects.filter(host_id__in=host_ids)
        .exclude(health=GpuHealth.HEALTHY)
        .values_list("pk", "health")
    )
    for tick in ticks:
        try:
            records.append(_prepare_tick(tick, maps.get(tick.host_id, {}), sick, result))
        except Exception as error:  # one host's bad tick never costs another host its own
            if _warn_once(tick.host_id):
                logger.warning(
                    "host %s: a telemetry tick was dropped: %s", tick.host_id, cut(error)
                )
    result.host_ids = host_ids
    # Every host that sent something was seen, even one whose tick was dropped.
    prepared.hosts = sorted({(t.host_id, t.host_created) for t in ticks})
    return prepared


def _prepare_tick(tick: Tick, gpu_map: GpuMap, sick: dict[int, str], out: Ingested) -> HostRecord:
    """One host's tick: its GPUs' live values into ``out``, and its store record (the hot path:
    thousands of GPUs a second, hence the plain loops)."""
    healthy = GpuHealth.HEALTHY.value
    ts = trusted_ts(float(tick.telemetry["ts"]), tick.received_at)
    ts_ms = int(ts * 1000)
    gpu_ticks: list[GpuTick] = []
    replicas: list[ReplicaTick] = []
    live: dict[str, dict[str, Any]] = {}
    for sample in tick.telemetry["gpus"]:
        known = gpu_map.get(sample["uuid"])
        if known is None:
            continue
        gpu_id, instances, on_gpu = known
        if on_gpu is not NO_REPLICAS:
            replicas.extend(replica_ticks(sample, on_gpu))
        util = sample["utilization_gpu_percent"]
        memory = sample["memory_used_mib"]
        temperature = sample["temperature_c"]
        power_mw = sample["power_mw"]
        power_w = power_mw / 1000 if power_mw is not None else None
        gpu_ticks.append(GpuTick(gpu_id, util, memory, temperature, power_w, sample))  # type: ignore[arg-type]
        partitions: dict[str, dict[str, Any]] = {}
        for m in sample["mig"]:
            partition = instances.get(m["gpu_instance_id"])
            if partition is not None:
                partitions[str(partition)] = {
                    "utilization_percent": _r(m["utilization_percent"]),
                    "memory_used_mib": _r(m["memory_used_mib"]),
                }
        # GpuLive, plus the sample's agent time in ms (an int: browsers round floats).
        live[str(gpu_id)] = {
            "utilization_percent": _r(util),
            "memory_used_mib": _r(memory),
            "memory_total_mib": _r(sample["memory_total_mib"]),
            "temperature_c": _r(temperature),
            "power_w": _r(power_w),
            "health": sick.get(gpu_id, healthy),
            "partitions": partitions,
            "ts_ms": ts_ms,
        }
    # Only now, when the whole tick was read: a tick that fails half-way adds nothing.
    out.live.update(live)
    utils = [u for u in (g.utilization_percent for g in gpu_ticks) if u is not None]
    out.hosts_util.append([tick.host_id, round(sum(utils), 1), len(utils), len(gpu_ticks)])
    out.ts = max(out.ts, ts)
    out.samples += len(gpu_ticks)
    readings = _readings(tick.telemetry, gpu_map)
    return HostRecord(tick.host_id, ts, tick.received_at, gpu_ticks, replicas, readings)


def _readings(telemetry: protocol.Telemetry, gpu_map: GpuMap) -> list[ReplicaReading]:
    """The tick's readings of the replicas' own metrics, of this host's replicas only (an
    agent is not trusted to speak for another host's)."""
    metrics = telemetry.get("replica_metrics")
    if not metrics:
        return []
    on_host: set[int] = set()
    for _, _, on_gpu in gpu_map.values():
        on_host.update(on_gpu.by_instance.values())
        on_host.update(on_gpu.by_processes)
    return [
        ReplicaReading(m["allocation_id"], m["name"], m["value"], m["error"])
        for m in metrics
        if m["allocation_id"] in on_host
    ]


def persist(prepared: Prepared, *, touch: bool = True) -> None:
    """Store a prepared batch: ``last_seen_at`` first (whatever the store does, the hosts were
    heard), then one hot-store pipeline. A store that is down loses the batch's points, never
    the hosts' heartbeats; a host whose record cannot be encoded loses its own alone.
    ``touch=False``: the caller writes the heartbeats itself (the sockets do, ahead of
    telemetry: :mod:`fleet.live.presence`)."""
    if prepared.hosts and touch:
        hosts_touch(prepared.hosts, prepared.received_at)
    if prepared.records:
        get_store().record_many(prepared.records)
