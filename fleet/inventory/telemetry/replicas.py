"""The replica codec: one replica's 1 s point packed in 16 bytes, and the means of a bucket.

A replica (an allocation) is measured from what its host's agent already sends in a tick: its
MIG instance's values, or the memory of the processes the agent attributes to it, plus the GPU's
utilisation for a whole-GPU replica (:mod:`fleet.agents.ingest` derives them). The store keys
the points by the allocation's id only: this floor knows nothing of allocations.

``None`` is kept as ``None`` (NVML had no value), never packed or averaged as 0.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypedDict

from fleet.inventory.telemetry.codec import ROLLUP_SECONDS, _u16, _u32

# allocation id, milliseconds into the minute, utilisation in 0.1 %, memory MiB;
# the all-ones value means None
REPLICA_RECORD = struct.Struct("<QHHI")
_NONE_U16 = 0xFFFF
_NONE_U32 = 0xFFFFFFFF


class ReplicaPoint(TypedDict):
    """One point of a replica's history; ``ts`` is Unix seconds (the bucket start for means)."""

    ts: float
    utilization_percent: float | None
    memory_used_mib: float | None


@dataclass(frozen=True, slots=True)
class ReplicaTick:
    """One replica's values in one tick."""

    allocation_id: int
    utilization_percent: float | None
    memory_used_mib: float | None


def pack_replicas(ts: float, ticks: Sequence[ReplicaTick]) -> bytes:
    """The 1 s points of one tick's replicas (all in the minute of ``ts``)."""
    offset_ms = min(59_999, int((ts % ROLLUP_SECONDS) * 1000))
    return b"".join(
        REPLICA_RECORD.pack(
            t.allocation_id, offset_ms, _u16(t.utilization_percent, 10), _u32(t.memory_used_mib)
        )
        for t in ticks
    )


def unpack_replicas(
    minute: int, data: bytes, allocation_id: int | None = None
) -> list[tuple[int, ReplicaPoint]]:
    """``(allocation id, point)`` of a minute's bucket, optionally of one replica only."""
    base = minute * ROLLUP_SECONDS
    usable = len(data) - len(data) % REPLICA_RECORD.size
    return [
        (
            aid,
            ReplicaPoint(
                ts=base + ms / 1000,
                utilization_percent=None if util == _NONE_U16 else util / 10,
                memory_used_mib=None if mem == _NONE_U32 else float(mem),
            ),
        )
        for aid, ms, util, mem in REPLICA_RECORD.iter_unpack(data[:usable])
        if allocation_id is None or aid == allocation_id
    ]


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def mean_replica_points(points: Iterable[ReplicaPoint], bucket_s: float) -> list[ReplicaPoint]:
    """Means per ``bucket_s`` bucket (ts = bucket start); a metric with no value stays ``None``."""
    buckets: dict[int, list[ReplicaPoint]] = {}
    for point in points:
        buckets.setdefault(int(point["ts"] // bucket_s), []).append(point)
    return [
        ReplicaPoint(
            ts=float(index * bucket_s),
            utilization_percent=_mean(p["utilization_percent"] for p in buckets[index]),
            memory_used_mib=_mean(p["memory_used_mib"] for p in buckets[index]),
        )
        for index in sorted(buckets)
    ]
