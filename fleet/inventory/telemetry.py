"""Telemetry at fleet scale: the latest sample and the last hour at 1 s outside PostgreSQL,
per-minute means in PostgreSQL for a week, and a live publisher that merges many hosts into few
messages.

Why: at 10,000 GPUs and one sample a second, a row per sample (and a ``Gpu`` row update per
sample) is 10k writes/s, more than a small PostgreSQL and one ASGI process can absorb. So:

* **Hot store** (:func:`get_store`): Redis when ``settings.REDIS_URL`` is set (shared by every
  ASGI process and the Celery worker), process memory otherwise (the embedded mode is one
  process). A batch of ticks, however many hosts, costs one round trip (:meth:`record_many`:
  ``APPEND`` + ``EXPIRE`` per host, one ``HSET``):

  - ``latest``: one hash field per GPU, ``{"ts", "received_at", "sample"}`` with the agent's
    sample as sent (processes, MIG instances included), read by
    :func:`fleet.inventory.selectors.latest_telemetry`;
  - ``raw:<host id>:<minute>``: the host's 1 s points of that minute, packed 16 bytes a point
    (:data:`RECORD`), expiring after ``FLEET_TELEMETRY_RAW_SECONDS`` (default one hour) — so the
    raw history is bounded by time, whatever the fleet sends (about 576 MB an hour at 10k GPUs
    in Redis, against ~3 GB as PostgreSQL rows).

* **Rollup** (:func:`rollup`, Celery beat every minute): the means of each closed minute become
  ``TelemetrySample(resolution_s=60)`` rows (idempotent: the unique constraint ignores a
  repeat), and the latest samples are checkpointed into ``Gpu.last_telemetry``.
  **Retention** (:func:`retention`, beat hourly) deletes 60 s points older than
  ``FLEET_TELEMETRY_KEEP_SECONDS`` (default 7 days) and any 1 s row left from older versions.

* **Live**: ticks from agent sockets are batched per ASGI process by :mod:`fleet.live.ingest`
  (mapped and stored by :mod:`fleet.inventory.ingest`), one ``live.telemetry`` group message per
  batch. :func:`publish_live` serves the other callers (the REST fallback): inside an ASGI
  server on a Redis channel layer their events are merged for ``FLEET_LIVE_BATCH_SECONDS``
  (default 0.1 s) into one group message; anywhere else (tests, the in-memory layer, a worker)
  each event is sent at once.

``None`` is kept as ``None`` everywhere (NVML had no value); it is never stored as 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol, TypedDict

import orjson
from django.conf import settings

logger = logging.getLogger(__name__)

ROLLUP_SECONDS = 60
# gpu id, milliseconds into the minute, utilisation in 0.1 %, memory MiB,
# temperature in C, power in 0.1 W; the all-ones value (i16: the minimum) means None
RECORD = struct.Struct("<IHHIhH")
_NONE_U16 = 0xFFFF
_NONE_U32 = 0xFFFFFFFF
_NONE_I16 = -0x8000
# An agent clock further than this from the server's is not trusted for bucketing.
MAX_CLOCK_SKEW_S = 300.0


def raw_seconds() -> int:
    return int(getattr(settings, "FLEET_TELEMETRY_RAW_SECONDS", 3600))


def keep_seconds() -> int:
    return int(getattr(settings, "FLEET_TELEMETRY_KEEP_SECONDS", 7 * 86400))


class Point(TypedDict):
    """One history point; ``ts`` is Unix seconds (the start of the bucket for means)."""

    ts: float
    utilization_percent: float | None
    memory_used_mib: float | None
    temperature_c: float | None
    power_w: float | None


METRICS = ("utilization_percent", "memory_used_mib", "temperature_c", "power_w")


class Latest(TypedDict):
    """The latest sample of one GPU: agent time, server receipt time, the sample as sent."""

    ts: float
    received_at: float
    sample: dict[str, Any]


@dataclass(frozen=True)
class GpuTick:
    """One GPU's values in one tick (``sample`` is the agent's raw sample, kept as latest)."""

    gpu_id: int
    utilization_percent: float | None
    memory_used_mib: float | None
    temperature_c: float | None
    power_w: float | None
    sample: dict[str, Any]


# -- packing -------------------------------------------------------------------------------------


def _u16(value: float | None, scale: float) -> int:
    if value is None or math.isnan(value):
        return _NONE_U16
    return max(0, min(_NONE_U16 - 1, round(value * scale)))


def _u32(value: float | None) -> int:
    if value is None or math.isnan(value):
        return _NONE_U32
    return max(0, min(_NONE_U32 - 1, round(value)))


def _i16(value: float | None) -> int:
    if value is None or math.isnan(value):
        return _NONE_I16
    return max(_NONE_I16 + 1, min(0x7FFF, round(value)))


def pack(ts: float, ticks: Sequence[GpuTick]) -> bytes:
    """The 1 s points of one tick (all in the minute of ``ts``)."""
    offset_ms = min(59_999, int((ts % ROLLUP_SECONDS) * 1000))
    return b"".join(
        RECORD.pack(
            t.gpu_id,
            offset_ms,
            _u16(t.utilization_percent, 10),
            _u32(t.memory_used_mib),
            _i16(t.temperature_c),
            _u16(t.power_w, 10),
        )
        for t in ticks
    )


def unpack(minute: int, data: bytes, gpu_id: int | None = None) -> list[tuple[int, Point]]:
    """``(gpu id, point)`` of a minute's bucket, optionally of one GPU only."""
    base = minute * ROLLUP_SECONDS
    out: list[tuple[int, Point]] = []
    usable = len(data) - len(data) % RECORD.size
    for gid, ms, util, mem, temp, power in RECORD.iter_unpack(data[:usable]):
        if gpu_id is not None and gid != gpu_id:
            continue
        out.append(
            (
                gid,
                Point(
                    ts=base + ms / 1000,
                    utilization_percent=None if util == _NONE_U16 else util / 10,
                    memory_used_mib=None if mem == _NONE_U32 else float(mem),
                    temperature_c=None if temp == _NONE_I16 else float(temp),
                    power_w=None if power == _NONE_U16 else power / 10,
                ),
            )
        )
    return out


def mean_points(points: Iterable[Point], bucket_s: int) -> list[Point]:
    """Means per ``bucket_s`` bucket (ts = bucket start); a metric with no value stays ``None``."""
    buckets: dict[int, list[Point]] = {}
    for point in points:
        buckets.setdefault(int(point["ts"] // bucket_s), []).append(point)
    out: list[Point] = []
    for bucket in sorted(buckets):
        group = buckets[bucket]
        means: dict[str, float | None] = {}
        for metric in METRICS:
            values: list[float] = [
                p[metric]  # type: ignore[literal-required]
                for p in group
                if p[metric] is not None  # type: ignore[literal-required]
            ]
            means[metric] = sum(values) / len(values) if values else None
        out.append(
            Point(
                ts=float(bucket * bucket_s),
                utilization_percent=means["utilization_percent"],
                memory_used_mib=means["memory_used_mib"],
                temperature_c=means["temperature_c"],
                power_w=means["power_w"],
            )
        )
    return out


# -- stores --------------------------------------------------------------------------------------


class HostRecord(NamedTuple):
    """One host's tick for :meth:`TelemetryStore.record_many`."""

    host_id: int
    ts: float
    received_at: float
    ticks: Sequence[GpuTick]


class TelemetryStore(Protocol):
    def record(
        self, *, host_id: int, ts: float, received_at: float, ticks: Sequence[GpuTick]
    ) -> None: ...

    def record_many(self, records: Sequence[HostRecord]) -> None: ...

    def latest(self, gpu_ids: Iterable[int]) -> dict[int, Latest]: ...

    def all_latest(self) -> dict[int, Latest]: ...

    def forget_latest(self, gpu_ids: Iterable[int]) -> None: ...

    def raw_buckets(self, host_ids: Sequence[int], minute: int) -> dict[int, bytes]: ...

    def get_mark(self, name: str) -> int | None: ...

    def set_mark(self, name: str, value: int) -> None: ...

    def clear(self) -> None: ...


def _latest_json(ts: float, received_at: float, sample: dict[str, Any]) -> bytes:
    return orjson.dumps({"ts": ts, "received_at": received_at, "sample": sample})


class MemoryStore:
    """Process memory (the embedded mode): the same behaviour as :class:`RedisStore`."""

    def __init__(self, raw_s: int) -> None:
        self.raw_s = raw_s
        self._lock = threading.Lock()
        self._latest: dict[int, Latest] = {}
        self._raw: dict[tuple[int, int], bytearray] = {}
        self._marks: dict[str, int] = {}
        self._pruned = 0

    def record(
        self, *, host_id: int, ts: float, received_at: float, ticks: Sequence[GpuTick]
    ) -> None:
        self.record_many([HostRecord(host_id, ts, received_at, ticks)])

    def record_many(self, records: Sequence[HostRecord]) -> None:
        with self._lock:
            for host_id, ts, received_at, ticks in records:
                minute = int(ts // ROLLUP_SECONDS)
                self._raw.setdefault((host_id, minute), bytearray()).extend(pack(ts, ticks))
                for t in ticks:
                    self._latest[t.gpu_id] = Latest(ts=ts, received_at=received_at, sample=t.sample)
            now_minute = int(time.time() // ROLLUP_SECONDS)
            if now_minute != self._pruned:
                self._pruned = now_minute
                self._prune(now_minute)

    def _prune(self, now_minute: int) -> None:
        oldest = now_minute - _bucket_minutes(self.raw_s)
        for key in [k for k in self._raw if k[1] < oldest]:
            del self._raw[key]

    def latest(self, gpu_ids: Iterable[int]) -> dict[int, Latest]:
        with self._lock:
            return {g: self._latest[g] for g in gpu_ids if g in self._latest}

    def all_latest(self) -> dict[int, Latest]:
        with self._lock:
            return dict(self._latest)

    def forget_latest(self, gpu_ids: Iterable[int]) -> None:
        with self._lock:
            for g in gpu_ids:
                self._latest.pop(g, None)

    def raw_buckets(self, host_ids: Sequence[int], minute: int) -> dict[int, bytes]:
        with self._lock:
            self._prune(int(time.time() // ROLLUP_SECONDS))
            return {h: bytes(self._raw[(h, minute)]) for h in host_ids if (h, minute) in self._raw}

    def get_mark(self, name: str) -> int | None:
        return self._marks.get(name)

    def set_mark(self, name: str, value: int) -> None:
        self._marks[name] = value

    def clear(self) -> None:
        with self._lock:
            self._latest.clear()
            self._raw.clear()
            self._marks.clear()


def _bucket_minutes(raw_s: int) -> int:
    """How many minute buckets cover ``raw_s`` seconds (plus the one being written)."""
    return math.ceil(raw_s / ROLLUP_SECONDS) + 1


class RedisStore:
    """Redis (production): shared by every ASGI process and worker; keys under ``prefix``."""

    def __init__(self, url: str, prefix: str, raw_s: int) -> None:
        import redis

        self.raw_s = raw_s
        self.prefix = prefix
        self.client = redis.Redis.from_url(url, socket_timeout=5, health_check_interval=30)

    def _raw_key(self, host_id: int, minute: int) -> str:
        return f"{self.prefix}raw:{host_id}:{minute}"

    def record(
        self, *, host_id: int, ts: float, received_at: float, ticks: Sequence[GpuTick]
    ) -> None:
        self.record_many([HostRecord(host_id, ts, received_at, ticks)])

    def record_many(self, records: Sequence[HostRecord]) -> None:
        """One pipeline (one round trip) for every host of a batch."""
        if not records:
            return
        pipe = self.client.pipeline(transaction=False)
        latest: dict[int, bytes] = {}
        expire_after = _bucket_minutes(self.raw_s)
        for host_id, ts, received_at, ticks in records:
            minute = int(ts // ROLLUP_SECONDS)
            key = self._raw_key(host_id, minute)
            pipe.append(key, pack(ts, ticks))
            # The bucket lives until the end of the raw window counted from its minute's end.
            pipe.expireat(key, (minute + expire_after) * ROLLUP_SECONDS)
            for t in ticks:
                latest[t.gpu_id] = _latest_json(ts, received_at, t.sample)
        if latest:
            pipe.hset(f"{self.prefix}latest", mapping=latest)  # type: ignore[arg-type]
        pipe.execute()

    def latest(self, gpu_ids: Iterable[int]) -> dict[int, Latest]:
        ids = list(gpu_ids)
        if not ids:
            return {}
        values = self.client.hmget(f"{self.prefix}latest", ids)
        return {g: json.loads(v) for g, v in zip(ids, values, strict=True) if v is not None}

    def all_latest(self) -> dict[int, Latest]:
        raw = self.client.hgetall(f"{self.prefix}latest")
        return {int(k): json.loads(v) for k, v in raw.items()}

    def forget_latest(self, gpu_ids: Iterable[int]) -> None:
        ids = list(gpu_ids)
        if ids:
            self.client.hdel(f"{self.prefix}latest", *ids)

    def raw_buckets(self, host_ids: Sequence[int], minute: int) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        for start in range(0, len(host_ids), 500):
            chunk = list(host_ids[start : start + 500])
            values = self.client.mget([self._raw_key(h, minute) for h in chunk])
            out.update({h: _as_bytes(v) for h, v in zip(chunk, values, strict=True) if v})
        return out

    def get_mark(self, name: str) -> int | None:
        value = self.client.get(f"{self.prefix}mark:{name}")
        return int(value) if value is not None else None

    def set_mark(self, name: str, value: int) -> None:
        self.client.set(f"{self.prefix}mark:{name}", value)

    def clear(self) -> None:
        keys = list(self.client.scan_iter(match=f"{self.prefix}*", count=1000))
        for start in range(0, len(keys), 1000):
            self.client.delete(*keys[start : start + 1000])


def _as_bytes(value: Any) -> bytes:
    return value.encode("latin-1") if isinstance(value, str) else bytes(value)


_stores: dict[tuple[str, str, int], TelemetryStore] = {}
_stores_lock = threading.Lock()


def store_prefix() -> str:
    """Keys are namespaced by database, so test runs and stacks sharing a Redis never mix."""
    from django.db import connection

    custom = getattr(settings, "FLEET_TELEMETRY_PREFIX", "")
    return custom or f"fleet:tel:{connection.settings_dict.get('NAME', '')}:"


def get_store() -> TelemetryStore:
    """The process's store: Redis when ``settings.REDIS_URL`` is set, memory otherwise."""
    url = str(getattr(settings, "REDIS_URL", "") or "")
    key = (url, store_prefix() if url else "", raw_seconds())
    store = _stores.get(key)
    if store is None:
        with _stores_lock:
            store = _stores.get(key)
            if store is None:
                store = RedisStore(url, key[1], key[2]) if url else MemoryStore(key[2])
                _stores[key] = store
    return store


def trusted_ts(ts: float, now: float) -> float:
    """The agent's timestamp, or the server's when the agent's clock is far off."""
    return ts if abs(ts - now) <= MAX_CLOCK_SKEW_S else now


# -- rollup and retention ------------------------------------------------------------------------

ROLLUP_MARK = "rollup"
ROLLUP_GRACE_S = 5.0


def rollup(now: float | None = None) -> int:
    """Per-minute means of every closed minute not yet rolled up -> ``TelemetrySample(60)``.

    Idempotent (a repeated minute is ignored by the unique constraint) and bounded: at most the
    minutes still in the raw window. Also checkpoints the latest samples into
    ``Gpu.last_telemetry`` so the database keeps the last known values. Returns rows written.
    """
    from fleet.inventory.models import Gpu, Host, TelemetrySample

    now = time.time() if now is None else now
    store = get_store()
    last_closed = int((now - ROLLUP_GRACE_S) // ROLLUP_SECONDS) - 1
    first_kept = int(now // ROLLUP_SECONDS) - _bucket_minutes(store_raw_seconds(store)) + 1
    mark = store.get_mark(ROLLUP_MARK)
    start = max(first_kept, (mark + 1) if mark is not None else first_kept)
    host_ids = list(Host.objects.values_list("pk", flat=True))
    gpu_ids = set(Gpu.objects.values_list("pk", flat=True))
    written = 0
    for minute in range(start, last_closed + 1):
        rows = []
        for data in store.raw_buckets(host_ids, minute).values():
            by_gpu: dict[int, list[Point]] = {}
            for gid, point in unpack(minute, data):
                by_gpu.setdefault(gid, []).append(point)
            for gid, points in by_gpu.items():
                if gid not in gpu_ids:
                    continue
                (mean,) = mean_points(points, ROLLUP_SECONDS)
                rows.append(
                    TelemetrySample(
                        gpu_id=gid,
                        ts=datetime.fromtimestamp(minute * ROLLUP_SECONDS, tz=UTC),
                        resolution_s=ROLLUP_SECONDS,
                        utilization_percent=mean["utilization_percent"],
                        memory_used_mib=mean["memory_used_mib"],
                        temperature_c=mean["temperature_c"],
                        power_w=mean["power_w"],
                    )
                )
        TelemetrySample.objects.bulk_create(rows, ignore_conflicts=True, batch_size=1000)
        written += len(rows)
        store.set_mark(ROLLUP_MARK, minute)
    checkpoint_latest(gpu_ids)
    return written


def store_raw_seconds(store: TelemetryStore) -> int:
    return int(getattr(store, "raw_s", raw_seconds()))


def checkpoint_latest(gpu_ids: set[int] | None = None) -> int:
    """Copy the latest samples into ``Gpu.last_telemetry`` (the durable last known values)."""
    from fleet.inventory.models import Gpu

    store = get_store()
    latest = store.all_latest()
    if gpu_ids is not None:
        gone = [g for g in latest if g not in gpu_ids]
        store.forget_latest(gone)
        latest = {g: v for g, v in latest.items() if g in gpu_ids}
    rows = [
        Gpu(
            pk=gid,
            last_telemetry=value["sample"],
            last_telemetry_at=datetime.fromtimestamp(value["received_at"], tz=UTC),
        )
        for gid, value in latest.items()
    ]
    Gpu.objects.bulk_update(rows, ["last_telemetry", "last_telemetry_at"], batch_size=500)
    return len(rows)


def retention(now: datetime | None = None) -> int:
    """Delete 60 s points past the week and 1 s rows past the hour; returns rows deleted."""
    from django.utils import timezone

    from fleet.inventory.models import TelemetrySample

    now = now or timezone.now()
    minutes, _ = TelemetrySample.objects.filter(
        resolution_s=ROLLUP_SECONDS, ts__lt=now - timedelta(seconds=keep_seconds())
    ).delete()
    seconds, _ = TelemetrySample.objects.filter(
        resolution_s=1, ts__lt=now - timedelta(seconds=raw_seconds())
    ).delete()
    return minutes + seconds


# -- live ----------------------------------------------------------------------------------------


def batch_seconds() -> float:
    return float(getattr(settings, "FLEET_LIVE_BATCH_SECONDS", 0.1))


class LivePublisher:
    """Merges ``live.telemetry`` of many hosts for a short window into one group message.

    Only used from a worker thread of an ASGI server (the home loop runs elsewhere) on a
    cross-process channel layer; the caller hands its event over and returns at once. A merged
    event has the usual shape (``type``, ``host_id``, ``ts``, ``gpus``) plus ``host_ids``;
    ``host_id`` is the host when the window held one host, else 0.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gpus: dict[str, dict[str, Any]] = {}
        self._hosts: list[int] = []
        self._ts = 0.0
        self._armed_at: float | None = None
        self.sent = 0

    def offer(self, host_id: int, ts: float, gpus: dict[str, dict[str, Any]]) -> bool:
        """Queue the event; ``False`` when it must be published directly instead."""
        from channels.layers import InMemoryChannelLayer, get_channel_layer

        from fleet.core import events

        window = batch_seconds()
        loop = events._home_loop
        if window <= 0 or loop is None or not loop.is_running() or loop.is_closed():
            return False
        try:
            if asyncio.get_running_loop() is loop:
                return False
        except RuntimeError:
            pass
        layer = get_channel_layer()
        if layer is None or isinstance(layer, InMemoryChannelLayer):
            return False
        now = time.monotonic()
        with self._lock:
            self._gpus.update(gpus)
            self._hosts.append(host_id)
            self._ts = max(self._ts, ts)
            # A window armed on a loop that has since gone (tests) is re-armed.
            arm = self._armed_at is None or now - self._armed_at > max(2.0, 20 * window)
            if arm:
                self._armed_at = now
        if arm:
            try:
                loop.call_soon_threadsafe(self._arm, loop, layer, window)
            except RuntimeError:  # the loop closed meanwhile
                with self._lock:
                    self._armed_at = None
                return False
        return True

    def _arm(self, loop: asyncio.AbstractEventLoop, layer: Any, window: float) -> None:
        loop.call_later(window, lambda: loop.create_task(self._flush(layer)))

    def take(self) -> dict[str, Any] | None:
        with self._lock:
            self._armed_at = None
            if not self._hosts:
                return None
            hosts, gpus, ts = self._hosts, self._gpus, self._ts
            self._hosts, self._gpus, self._ts = [], {}, 0.0
        unique = sorted(set(hosts))
        return {
            "type": "live.telemetry",
            "host_id": unique[0] if len(unique) == 1 else 0,
            "host_ids": unique,
            "ts": ts,
            "gpus": gpus,
        }

    async def _flush(self, layer: Any) -> None:
        from fleet.core.events import FLEET_GROUP

        event = self.take()
        if event is None:
            return
        try:
            await layer.group_send(FLEET_GROUP, event)
            self.sent += 1
        except Exception:
            logger.warning("live telemetry publish failed", exc_info=True)


live_publisher = LivePublisher()


def publish_live(host_id: int, ts: float, gpus: dict[str, dict[str, Any]]) -> None:
    """Send one host's ``live.telemetry`` (merged with others' inside an ASGI server)."""
    from fleet.core.events import FLEET_GROUP, publish

    if live_publisher.offer(host_id, ts, gpus):
        return
    publish(FLEET_GROUP, "live.telemetry", {"host_id": host_id, "ts": ts, "gpus": gpus})
