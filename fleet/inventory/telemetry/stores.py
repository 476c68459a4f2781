"""The telemetry hot store: Redis in production (shared by every ASGI process and worker), process
memory in the embedded mode; one round trip per batch of ticks, whatever the number of hosts."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol

import orjson
from django.conf import settings
from django.db import connection

from fleet.core.ratelimit import OncePer, cut
from fleet.inventory.telemetry.codec import (
    MAX_CLOCK_SKEW_S,
    ROLLUP_SECONDS,
    GpuTick,
    Latest,
    pack,
    raw_seconds,
)
from fleet.inventory.telemetry.metrics import (
    READING_TTL_S,
    ReplicaReading,
    StoredReading,
    as_stored,
)
from fleet.inventory.telemetry.replicas import ReplicaTick, pack_replicas

logger = logging.getLogger(__name__)


class HostRecord(NamedTuple):
    """One host's tick for :meth:`TelemetryStore.record_many` (``replicas``: the values of the
    replicas on its GPUs, derived from the same tick)."""

    host_id: int
    ts: float
    received_at: float
    ticks: Sequence[GpuTick]
    replicas: Sequence[ReplicaTick] = ()
    # The replicas' own metrics (fleet.inventory.telemetry.metrics), already checked to be
    # this host's replicas.
    readings: Sequence[ReplicaReading] = ()


class TelemetryStore(Protocol):
    def record(
        self, *, host_id: int, ts: float, received_at: float, ticks: Sequence[GpuTick]
    ) -> None: ...

    def record_many(self, records: Sequence[HostRecord]) -> list[int]: ...

    def latest(self, gpu_ids: Iterable[int]) -> dict[int, Latest]: ...

    def all_latest(self) -> dict[int, Latest]: ...

    def forget_latest(self, gpu_ids: Iterable[int]) -> None: ...

    def raw_buckets(self, host_ids: Sequence[int], minute: int) -> dict[int, bytes]: ...

    def replica_buckets(self, host_ids: Sequence[int], minute: int) -> dict[int, bytes]: ...

    def replica_readings(
        self, allocation_ids: Iterable[int]
    ) -> dict[int, dict[str, StoredReading]]: ...

    def get_mark(self, name: str) -> int | None: ...

    def set_mark(self, name: str, value: int) -> None: ...

    def add_counts(self, counts: dict[str, int]) -> None: ...

    def counts(self) -> dict[str, int]: ...

    def clear(self) -> None: ...


def _latest_json(ts: float, received_at: float, sample: dict[str, Any]) -> bytes:
    return orjson.dumps({"ts": ts, "received_at": received_at, "sample": sample})


class _Encoded(NamedTuple):
    host_id: int
    minute: int
    points: bytes
    latest: dict[int, Any]  # gpu id -> Latest (memory) or its JSON (Redis)
    replica_points: bytes
    readings: dict[int, dict[str, StoredReading]]


def _encode(records: Sequence[HostRecord], as_json: bool) -> tuple[list[_Encoded], list[int]]:
    """Each host's record packed on its own: one that cannot be encoded is skipped (and its host
    returned) while every other host's is stored. Samples are bounded projections already; this
    is the second wall, so that no value can ever cost other hosts their tick."""
    out: list[_Encoded] = []
    failed: list[int] = []
    for host_id, ts, received_at, ticks, replicas, readings in records:
        try:
            latest: dict[int, Any] = {
                t.gpu_id: _latest_json(ts, received_at, t.sample)
                if as_json
                else Latest(ts=ts, received_at=received_at, sample=t.sample)
                for t in ticks
            }
            minute = int(ts // ROLLUP_SECONDS)
            points = pack(ts, ticks)
            out.append(
                _Encoded(
                    host_id,
                    minute,
                    points,
                    latest,
                    pack_replicas(ts, replicas),
                    as_stored(list(readings), received_at),
                )
            )
        except Exception as error:  # whatever it is, it is this host's alone
            failed.append(host_id)
            if _warn_once(host_id):
                logger.warning("telemetry of host %s not stored: %s", host_id, cut(error))
    return out, failed


_warn_once = OncePer(60.0)  # a broken agent must not flood the log: a line per host a minute


class MemoryStore:
    """Process memory (the embedded mode): the same behaviour as :class:`RedisStore`."""

    def __init__(self, raw_s: int) -> None:
        self.raw_s = raw_s
        self._lock = threading.Lock()
        self._latest: dict[int, Latest] = {}
        self._raw: dict[tuple[int, int], bytearray] = {}
        self._replica_raw: dict[tuple[int, int], bytearray] = {}
        # allocation id -> (kept until, {metric name: reading})
        self._readings: dict[int, tuple[float, dict[str, StoredReading]]] = {}
        self._marks: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._pruned = 0

    def record(
        self, *, host_id: int, ts: float, received_at: float, ticks: Sequence[GpuTick]
    ) -> None:
        self.record_many([HostRecord(host_id, ts, received_at, ticks)])

    def record_many(self, records: Sequence[HostRecord]) -> list[int]:
        encoded, failed = _encode(records, as_json=False)
        with self._lock:
            for host_id, minute, points, latest, replica_points, readings in encoded:
                self._raw.setdefault((host_id, minute), bytearray()).extend(points)
                until = time.time() + READING_TTL_S
                self._readings.update((aid, (until, r)) for aid, r in readings.items())
                self._latest.update(latest)
                if replica_points:
                    key = (host_id, minute)
                    self._replica_raw.setdefault(key, bytearray()).extend(replica_points)
            now_minute = int(time.time() // ROLLUP_SECONDS)
            if now_minute != self._pruned:
                self._pruned = now_minute
                self._prune(now_minute)
        return failed

    def _prune(self, now_minute: int) -> None:
        now = time.time()
        for aid in [a for a, (until, _) in self._readings.items() if until < now]:
            del self._readings[aid]
        oldest = now_minute - bucket_minutes(self.raw_s)
        for raw in (self._raw, self._replica_raw):
            for key in [k for k in raw if k[1] < oldest]:
                del raw[key]

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

    def replica_buckets(self, host_ids: Sequence[int], minute: int) -> dict[int, bytes]:
        with self._lock:
            self._prune(int(time.time() // ROLLUP_SECONDS))
            raw = self._replica_raw
            return {h: bytes(raw[(h, minute)]) for h in host_ids if (h, minute) in raw}

    def replica_readings(
        self, allocation_ids: Iterable[int]
    ) -> dict[int, dict[str, StoredReading]]:
        now = time.time()
        with self._lock:
            found = {a: self._readings.get(a) for a in allocation_ids}
        return {a: dict(v[1]) for a, v in found.items() if v is not None and v[0] >= now}

    def get_mark(self, name: str) -> int | None:
        return self._marks.get(name)

    def set_mark(self, name: str, value: int) -> None:
        self._marks[name] = value

    def add_counts(self, counts: dict[str, int]) -> None:
        with self._lock:
            for key, n in counts.items():
                self._counts[key] = self._counts.get(key, 0) + n

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def clear(self) -> None:
        with self._lock:
            self._latest.clear()
            self._raw.clear()
            self._replica_raw.clear()
            self._readings.clear()
            self._marks.clear()
            self._counts.clear()


def bucket_minutes(raw_s: int) -> int:
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

    def _replica_key(self, host_id: int, minute: int) -> str:
        return f"{self.prefix}rraw:{host_id}:{minute}"

    def _reading_key(self, allocation_id: int) -> str:
        return f"{self.prefix}rmetric:{allocation_id}"

    def record(
        self, *, host_id: int, ts: float, received_at: float, ticks: Sequence[GpuTick]
    ) -> None:
        self.record_many([HostRecord(host_id, ts, received_at, ticks)])

    def record_many(self, records: Sequence[HostRecord]) -> list[int]:
        """One pipeline (one round trip) for every host of a batch; returns the hosts whose
        record could not be encoded (the others are stored).

        A bucket's expiry is set once, when an ``APPEND`` created it (its new length is what was
        appended: a new minute, or a Redis that restarted), in a second round trip that
        carries only those: about once a minute per host instead of with every tick."""
        encoded, failed = _encode(records, as_json=True)
        if not encoded:
            return failed
        pipe = self.client.pipeline(transaction=False)
        latest: dict[int, bytes] = {}
        expire_after = bucket_minutes(self.raw_s)
        appended: list[tuple[str, int, int]] = []  # key, bytes appended, expire at
        for host_id, minute, points, host_latest, replica_points, readings in encoded:
            # The bucket lives until the end of the raw window counted from its minute's end.
            expire_at = (minute + expire_after) * ROLLUP_SECONDS
            key = self._raw_key(host_id, minute)
            pipe.append(key, points)
            appended.append((key, len(points), expire_at))
            latest.update(host_latest)
            for aid, reading in readings.items():
                pipe.set(self._reading_key(aid), orjson.dumps(reading), ex=READING_TTL_S)
                appended.append(("", -1, 0))  # a SET answers True: never a bucket created
            if replica_points:
                replica_key = self._replica_key(host_id, minute)
                pipe.append(replica_key, replica_points)
                appended.append((replica_key, len(replica_points), expire_at))
        if latest:
            pipe.hset(f"{self.prefix}latest", mapping=latest)  # type: ignore[arg-type]
        lengths = pipe.execute()
        created = [
            (key, expire_at)
            for (key, size, expire_at), length in zip(appended, lengths, strict=False)
            if length == size
        ]
        if created:
            pipe = self.client.pipeline(transaction=False)
            for key, expire_at in created:
                pipe.expireat(key, expire_at)
            pipe.execute()
        return failed

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
        return self._buckets(self._raw_key, host_ids, minute)

    def replica_buckets(self, host_ids: Sequence[int], minute: int) -> dict[int, bytes]:
        return self._buckets(self._replica_key, host_ids, minute)

    def _buckets(
        self, key: Callable[[int, int], str], host_ids: Sequence[int], minute: int
    ) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        for start in range(0, len(host_ids), 500):
            chunk = list(host_ids[start : start + 500])
            values = self.client.mget([key(h, minute) for h in chunk])
            out.update({h: _as_bytes(v) for h, v in zip(chunk, values, strict=True) if v})
        return out

    def replica_readings(
        self, allocation_ids: Iterable[int]
    ) -> dict[int, dict[str, StoredReading]]:
        ids = list(allocation_ids)
        if not ids:
            return {}
        values = self.client.mget([self._reading_key(a) for a in ids])
        return {a: json.loads(v) for a, v in zip(ids, values, strict=True) if v is not None}

    def get_mark(self, name: str) -> int | None:
        value = self.client.get(f"{self.prefix}mark:{name}")
        return int(value) if value is not None else None

    def set_mark(self, name: str, value: int) -> None:
        self.client.set(f"{self.prefix}mark:{name}", value)

    def add_counts(self, counts: dict[str, int]) -> None:
        if counts:
            pipe = self.client.pipeline(transaction=False)
            for key, n in counts.items():
                pipe.hincrby(f"{self.prefix}counts", key, n)
            pipe.execute()

    def counts(self) -> dict[str, int]:
        raw = self.client.hgetall(f"{self.prefix}counts")
        return {_as_bytes(k).decode(): int(v) for k, v in raw.items()}

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


def store_raw_seconds(store: TelemetryStore) -> int:
    """How long ``store`` keeps 1 s points (a store may be configured apart from settings)."""
    return int(getattr(store, "raw_s", raw_seconds()))


# A minute is rolled up this long after it closed: ticks of its last second still in flight.
ROLLUP_GRACE_S = 5.0


def minutes_to_roll_up(store: TelemetryStore, mark: str, now: float) -> range:
    """The closed minutes a rollup that records its progress under ``mark`` has still to do:
    from the one after the mark (or the oldest still in the raw window) to the last closed one.
    Bounded by the raw window, however long the rollup was not run."""
    last_closed = int((now - ROLLUP_GRACE_S) // ROLLUP_SECONDS) - 1
    first_kept = int(now // ROLLUP_SECONDS) - bucket_minutes(store_raw_seconds(store)) + 1
    done = store.get_mark(mark)
    return range(max(first_kept, (done + 1) if done is not None else first_kept), last_closed + 1)
