"""Telemetry ingest in batches: many hosts' ticks stored with a handful of queries.

At 10,000 GPUs an ASGI process receives about a thousand telemetry messages a second. Handled
one by one, each cost a thread hop, a Redis round trip and, every few seconds, ORM queries; the
per-message overhead (not the work) was what saturated a 2-core server. So the live socket
collects ticks for a short window (:mod:`fleet.live.ingest`) and hands them here as one batch:

* **GPU maps** (UUID -> GPU id, MIG instance -> partition, and the replicas on each GPU) are
  cached per host and refreshed for all stale hosts of a batch in three queries. They change
  only when the agent's own hello or ack changes what it observed (a replica placed or released
  is a new generation the agent acks; the socket then calls :func:`forget_host`), so the cache can
  be long (``FLEET_TELEMETRY_GPU_CACHE_SECONDS``, default 60 s, a safety net for the REST
  fallback, whose requests may reach any process).
* **Health** is never cached: one query per batch returns the batch's GPUs that are not
  healthy (the others are), so a live frame never shows a healed GPU as sick or the opposite.
* **Replicas** are measured from the same tick (:func:`replica_ticks`): no query, a few
  dictionary lookups per GPU that holds replicas, nothing for the others.
* **The hot store** gets one pipeline for the whole batch (:meth:`TelemetryStore.record_many`).
* **Host.last_seen_at** gets one ``UPDATE … WHERE id IN (…)`` for the hosts not written for
  :func:`seen_every` seconds, whatever the hot store does (it is written first), and the same
  hosts come back from ``offline`` (:func:`hosts_seen`): any message of an agent, not only a
  new ``hello``, says the host is there.
* **Isolation.** One host's tick that cannot be mapped or stored is dropped alone (logged once
  a minute per host); every other host's ticks and heartbeat go through.

Live values are rounded here, once, to one decimal (frames stay small, browsers show no more);
``None`` stays ``None`` (NVML had no value).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.allocations.models import Allocation, RequestKind
from fleet.core import alerts
from fleet.core.events import publish_changed
from fleet.core.locking import lock_available
from fleet.core.ratelimit import OncePer, cut
from fleet.inventory.models import Gpu, GpuHealth, Host, HostStatus
from fleet.inventory.telemetry import GpuTick, HostRecord, ReplicaTick, get_store, trusted_ts
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
    maps = _fresh_maps(ticks, time.monotonic())
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
    return HostRecord(tick.host_id, ts, tick.received_at, gpu_ticks, replicas)


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


def hosts_touch(hosts: list[tuple[int, float]], now: float) -> None:
    """``last_seen_at`` for the hosts (``(id, created)``) this process has not written for
    :func:`seen_every` (heard at ``now``, a Unix time)."""
    every = seen_every()
    with _maps.lock:
        due = [h for h in hosts if now - _maps.seen_written.get(h, 0.0) >= every]
        if len(_maps.seen_written) > 100_000:
            _maps.seen_written.clear()
        for h in due:
            _maps.seen_written[h] = now
    if due:
        skipped: list[int] = []
        hosts_seen([h[0] for h in due], skipped=skipped)
        if skipped:  # held by a transaction now: written with the host's next tick
            with _maps.lock:
                for h in due:
                    if h[0] in skipped:
                        _maps.seen_written.pop(h, None)


def _alert_back(host_ids: list[int]) -> None:
    hooks = alerts.alert_subscribers(alerts.HOST_BACK)
    if hooks:
        names = Host.objects.filter(pk__in=host_ids).values_list("pk", "name")
        alerts.alert_emit_each(
            event=alerts.HOST_BACK,
            items=[(f"Host {n} is back", {"host": {"id": pk, "name": n}}) for pk, n in names],
            hooks=hooks,
        )


def hosts_seen(host_ids: Sequence[int], *, skipped: list[int] | None = None) -> list[int]:
    """The hosts' agents were heard: ``last_seen_at`` is now, and those that were ``offline``
    are ``ready`` again (whatever the message was: a socket that stayed open through a
    database or Redis stall sends ticks, not a new hello). Returns the hosts that came back.

    A host row another transaction holds (a drain, a placement bumping its generation) is
    skipped, never waited for: a heartbeat must not stall behind, or deadlock with, the control
    plane. Its ids go into ``skipped`` when given."""
    with transaction.atomic():
        free = lock_available(Host, host_ids)
        if skipped is not None:
            skipped.extend(sorted(set(host_ids) - set(free)))
        if not free:
            return []
        Host.objects.filter(pk__in=free).update(last_seen_at=timezone.now())
        ids = list(
            Host.objects.filter(pk__in=free, status=HostStatus.OFFLINE).values_list("pk", flat=True)
        )
        if ids:
            # Compare-and-set: a host marked cordoned or draining meanwhile keeps that state.
            Host.objects.filter(pk__in=ids, status=HostStatus.OFFLINE).update(
                status=HostStatus.READY, offline_since=None
            )
            _alert_back(ids)
    if ids:
        publish_changed("host", ids)
    return ids
