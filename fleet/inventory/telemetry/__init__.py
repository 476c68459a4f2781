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
  (mapped and stored by :mod:`fleet.agents.ingest`), one ``live.telemetry`` group message per
  batch. :func:`publish_live` serves the other callers (the REST fallback): inside an ASGI
  server on a Redis channel layer their events are merged for ``FLEET_LIVE_BATCH_SECONDS``
  (default 0.1 s) into one group message; anywhere else (tests, the in-memory layer, a worker)
  each event is sent at once.

* **Replicas** (:mod:`~fleet.inventory.telemetry.replicas`): each tick's values of the replicas
  on a host's GPUs (derived by :mod:`fleet.agents.ingest`) go in the same pipeline, packed 16
  bytes a point under ``rraw:<host id>:<minute>``, kept as long as the GPUs' raw points; their
  minutes are rolled up by :mod:`fleet.allocations.accounting.telemetry` (this floor knows only
  ids).

``None`` is kept as ``None`` everywhere (NVML had no value); it is never stored as 0.
"""

from __future__ import annotations

from fleet.inventory.telemetry.codec import (
    METRICS,
    RECORD,
    ROLLUP_SECONDS,
    GpuTick,
    Latest,
    Point,
    keep_seconds,
    mean_points,
    pack,
    raw_seconds,
    unpack,
)
from fleet.inventory.telemetry.history import checkpoint_latest, retention, rollup
from fleet.inventory.telemetry.live import LivePublisher, live_publisher, publish_live
from fleet.inventory.telemetry.replicas import (
    REPLICA_RECORD,
    ReplicaPoint,
    ReplicaTick,
    mean_replica_points,
    pack_replicas,
    unpack_replicas,
)
from fleet.inventory.telemetry.stores import (
    HostRecord,
    MemoryStore,
    RedisStore,
    TelemetryStore,
    get_store,
    store_prefix,
    store_raw_seconds,
    trusted_ts,
)

__all__ = [
    "METRICS",
    "RECORD",
    "REPLICA_RECORD",
    "ROLLUP_SECONDS",
    "GpuTick",
    "HostRecord",
    "Latest",
    "LivePublisher",
    "MemoryStore",
    "Point",
    "RedisStore",
    "ReplicaPoint",
    "ReplicaTick",
    "TelemetryStore",
    "checkpoint_latest",
    "get_store",
    "keep_seconds",
    "live_publisher",
    "mean_points",
    "mean_replica_points",
    "pack",
    "pack_replicas",
    "publish_live",
    "raw_seconds",
    "retention",
    "rollup",
    "store_prefix",
    "store_raw_seconds",
    "trusted_ts",
    "unpack",
    "unpack_replicas",
]
