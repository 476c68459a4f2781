"""Backend samples and events as protocol messages, with every value kept within its
physical range (the server refuses what is not: a broken sensor must not cost the tick)."""

from __future__ import annotations

from typing import TypeVar

from hostagent.gpu.backend import GpuEvent, GpuSample
from hostagent.protocol import MAX_PROCESSES, Event, GpuTelemetry, clip

_N = TypeVar("_N", int, float)


def within(value: _N | None, low: float, high: float) -> _N | None:
    """A driver value outside its physical range is no value (``None``), never sent as is: the
    server refuses out-of-range samples (a broken sensor must not cost the host its tick)."""
    if value is None or not low <= value <= high:
        return None
    return value


def mib(value: int | None) -> int | None:
    return within(value, 0, 2**32)


def telemetry_of(s: GpuSample) -> GpuTelemetry:
    return {
        "uuid": s.uuid,
        "status": s.status,
        "utilization_gpu_percent": within(s.utilization_gpu_percent, 0, 100),
        "memory_used_mib": mib(s.memory_used_mib),
        "memory_total_mib": mib(s.memory_total_mib),
        "temperature_c": within(s.temperature_c, -50, 150),
        "power_mw": within(s.power_mw, 0, 10**7),
        "ecc_corrected": within(s.ecc_corrected, 0, 2**63 - 1),
        "ecc_uncorrected": within(s.ecc_uncorrected, 0, 2**63 - 1),
        "processes": [
            {
                "pid": p.pid,
                "used_memory_mib": mib(p.used_memory_mib),
                "gpu_instance_id": p.gpu_instance_id,
                "compute_instance_id": p.compute_instance_id,
                "kind": p.kind,
            }
            for p in s.processes[:MAX_PROCESSES]
        ],
        "mig": [
            {
                "gpu_instance_id": m.gpu_instance_id,
                "compute_instance_id": m.compute_instance_id,
                "uuid": m.uuid,
                "utilization_percent": within(m.utilization_percent, 0, 100),
                "memory_used_mib": mib(m.memory_used_mib),
                "memory_total_mib": mib(m.memory_total_mib),
            }
            for m in s.mig
        ],
    }


def clip_or_none(text: str | None) -> str | None:
    return None if text is None else clip(text)


def event_of(e: GpuEvent) -> Event:
    return {
        "type": "event",
        "kind": e.kind,
        "gpu_uuid": e.gpu_uuid,
        "gpu_instance_id": e.gpu_instance_id,
        "xid": e.xid,
        "detail": clip(e.detail),
        "ts": e.ts,
    }
