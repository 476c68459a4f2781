"""The telemetry codec: a GPU's 1 s point packed in 16 bytes, and the means of a bucket of them.

``None`` is kept as ``None`` (NVML had no value); it is never packed or averaged as 0.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, TypedDict

from django.conf import settings

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


class GpuTick(NamedTuple):
    """One GPU's values in one tick (``sample`` is the agent's raw sample, kept as latest). A
    named tuple: thousands are made a second, and a frozen dataclass costs several times as
    much to build."""

    gpu_id: int
    utilization_percent: float | None
    memory_used_mib: float | None
    temperature_c: float | None
    power_w: float | None
    sample: dict[str, Any]


# -- packing -------------------------------------------------------------------------------------


# Values are bounded at the protocol boundary; these still never raise (an infinite or NaN
# value is "no value"), so no sample can fail a batch.
def _u16(value: float | None, scale: float) -> int:
    if value is None or not math.isfinite(value * scale):
        return _NONE_U16
    return max(0, min(_NONE_U16 - 1, round(value * scale)))


def _u32(value: float | None) -> int:
    if value is None or not math.isfinite(value):
        return _NONE_U32
    return max(0, min(_NONE_U32 - 1, round(value)))


def _i16(value: float | None) -> int:
    if value is None or not math.isfinite(value):
        return _NONE_I16
    return max(_NONE_I16 + 1, min(0x7FFF, round(value)))


def pack(ts: float, ticks: Sequence[GpuTick]) -> bytes:
    """The 1 s points of one tick (all in the minute of ``ts``)."""
    offset_ms = min(59_999, int((ts % ROLLUP_SECONDS) * 1000))
    return b"".join([_point(t, offset_ms) for t in ticks])


def _point(t: GpuTick, offset_ms: int) -> bytes:
    u, m, c, p = t.utilization_percent, t.memory_used_mib, t.temperature_c, t.power_w
    # The common case (every value there and in range) without a call per value; anything
    # else (None, out of range, NaN: every comparison with NaN is false) takes the careful path.
    if (
        u is not None
        and m is not None
        and c is not None
        and p is not None
        and 0 <= u <= 6553.4
        and 0 <= m < 4294967294.5
        and -32767.5 < c < 32767.5
        and 0 <= p <= 6553.4
    ):
        return RECORD.pack(t.gpu_id, offset_ms, round(u * 10), round(m), round(c), round(p * 10))
    return RECORD.pack(t.gpu_id, offset_ms, _u16(u, 10), _u32(m), _i16(c), _u16(p, 10))


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
