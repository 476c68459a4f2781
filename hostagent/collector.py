"""Builds ``hello``, ``telemetry`` and ``event`` messages from a backend (and the MPS manager).

Health events come from three places: the backend (Xid and ECC through ``nvmlEventSetWait``),
GPU status changes seen between ticks (``gpu_lost`` / ``gpu_back``), and MPS daemon health
changes (``mps_down`` / ``mps_up``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from hostagent import __version__
from hostagent.gpu.backend import (
    BackendError,
    GpuBackend,
    GpuDevice,
    GpuEvent,
    GpuSample,
    GpuUnavailable,
)
from hostagent.mps import MpsManager
from hostagent.protocol import (
    PROTOCOL_VERSION,
    BackendKind,
    Event,
    EventKind,
    GpuInfo,
    GpuStatus,
    GpuTelemetry,
    Hello,
    MpsState,
    PlacementProfile,
    Telemetry,
    empty_mps_state,
)

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0
REINIT_EVERY_S = 30.0


class Collector:
    """Reads a backend into wire messages; keeps what it needs to detect transitions."""

    def __init__(
        self,
        backend: GpuBackend,
        *,
        hostname: str,
        mps: MpsManager | None = None,
        allow_mutation: bool = False,
    ) -> None:
        self.backend = backend
        self.mps = mps
        self.hostname = hostname
        self.allow_mutation = allow_mutation
        self._status: dict[str, GpuStatus] = {}
        self._mps_health: dict[str, bool] = {}
        self._last_init_attempt = -REINIT_EVERY_S

    def ensure_backend(self) -> bool:
        """Initialise the backend if needed, retrying at most every 30 s; True if available."""
        if self.backend.available():
            return True
        now = time.monotonic()
        if now - self._last_init_attempt < REINIT_EVERY_S:
            return False
        self._last_init_attempt = now
        try:
            self.backend.init()
        except GpuUnavailable as exc:
            logger.warning("GPUs unavailable: %s", exc)
            return False
        return True

    def _devices(self) -> list[GpuDevice]:
        if not self.ensure_backend():
            return []
        try:
            return self.backend.list_gpus()
        except GpuUnavailable as exc:
            logger.warning("GPUs unavailable: %s", exc)
            return []

    def gpu_infos(self) -> list[GpuInfo]:
        """The ``gpus`` part of ``hello`` and of ``ack.observed``."""
        return [self._info(d) for d in self._devices()]

    def _info(self, d: GpuDevice) -> GpuInfo:
        placements: dict[str, PlacementProfile] = {}
        instances = []
        if d.status == "ok" and d.mig_capable:
            try:
                for p in self.backend.possible_placements(d.uuid):
                    placements[str(p.profile_id)] = {
                        "profile_id": p.profile_id,
                        "name": p.name,
                        "compute_slices": p.compute_slices,
                        "memory_slices": p.memory_slices,
                        "memory_mib": p.memory_mib,
                        "max_instances": p.max_instances,
                        "placements": [[s, z] for s, z in p.placements],
                    }
                instances = self.backend.mig_instances(d.uuid)
            except BackendError as exc:
                logger.warning("MIG discovery of %s failed: %s", d.uuid, exc)
        return {
            "index": d.index,
            "uuid": d.uuid,
            "name": d.name,
            "pci_device_id": d.pci_device_id,
            "memory_total_mib": d.memory_total_mib,
            "mig_capable": d.mig_capable,
            "mig_mode_current": d.mig_mode_current,
            "mig_mode_pending": d.mig_mode_pending,
            "status": d.status,
            "possible_placements": placements,
            "mig_instances": [
                {
                    "gpu_instance_id": i.gpu_instance_id,
                    "compute_instance_id": i.compute_instance_id,
                    "profile_id": i.profile_id,
                    "start": i.start,
                    "size": i.size,
                    "uuid": i.uuid,
                    "memory_mib": i.memory_mib,
                }
                for i in instances
            ],
            "mps": self._mps_state(d.uuid, [i.uuid for i in instances if i.uuid]),
        }

    def _mps_state(self, gpu: str, mig_uuids: list[str]) -> MpsState:
        state = empty_mps_state()
        if self.mps is None:
            return state
        managed = set(self.mps.managed_targets())
        if gpu in managed:
            info = self.mps.info(gpu)
            state["running"] = info["running"]
            state["healthy"] = info["healthy"]
            state["pipe_directory"] = info["pipe_directory"]
            state["default_active_thread_percentage"] = info["default_active_thread_percentage"]
            state["default_pinned_mem_limit_mib"] = info["default_pinned_mem_limit_mib"]
        state["instances"] = [self.mps.info(u) for u in mig_uuids if u in managed]
        return state

    def hello(self, applied_generation: int) -> Hello:
        """The ``hello`` message."""
        gpus = self.gpu_infos()
        kind: BackendKind = "nvml" if self.backend.kind == "nvml" else "simulated"
        return {
            "type": "hello",
            "protocol": PROTOCOL_VERSION,
            "agent_version": __version__,
            "hostname": self.hostname,
            "backend": kind,
            "allow_mutation": self.allow_mutation,
            "driver_version": self.backend.driver_version() if self.backend.available() else None,
            "nvml_version": self.backend.nvml_version() if self.backend.available() else None,
            "applied_generation": applied_generation,
            "gpus": gpus,
        }

    def telemetry(self) -> Telemetry:
        """One ``telemetry`` tick (``nvidia-smi --query-gpu`` for every GPU)."""
        gpus: list[GpuTelemetry] = []
        for d in self._devices():
            try:
                s = self.backend.sample(d.uuid)
            except BackendError as exc:
                logger.warning("sampling %s failed: %s", d.uuid, exc)
                s = GpuSample(uuid=d.uuid, status=d.status)
            gpus.append(_telemetry(s))
        return {"type": "telemetry", "ts": time.time(), "gpus": gpus}

    def events(self, timeout_ms: int = 0) -> list[Event]:
        """Backend events plus GPU status and MPS health transitions since the last call."""
        events: list[GpuEvent] = []
        if self.ensure_backend():
            try:
                events.extend(self.backend.wait_events(timeout_ms))
            except BackendError as exc:
                logger.warning("event wait failed: %s", exc)
        events.extend(self._status_events())
        events.extend(self._mps_events())
        return [_event(e) for e in events]

    def _status_events(self) -> list[GpuEvent]:
        out = []
        for d in self._devices():
            before = self._status.get(d.uuid, "ok")
            self._status[d.uuid] = d.status
            if before == d.status:
                continue
            if d.status == "lost":
                out.append(GpuEvent("gpu_lost", d.uuid, "GPU is lost", time.time()))
            elif d.status == "ok":
                out.append(GpuEvent("gpu_back", d.uuid, "GPU is back", time.time()))
        return out

    def _mps_events(self) -> list[GpuEvent]:
        if self.mps is None:
            return []
        out = []
        for target in self.mps.managed_targets():
            healthy = self.mps.healthy(target)
            before = self._mps_health.get(target, True)
            self._mps_health[target] = healthy
            if healthy != before:
                kind: EventKind = "mps_up" if healthy else "mps_down"
                detail = "MPS daemon answers again" if healthy else "MPS daemon does not answer"
                out.append(GpuEvent(kind, self._gpu_of(target), detail, time.time()))
        return out

    def _gpu_of(self, target: str) -> str:
        if target.startswith("GPU-"):
            return target
        for d in self._devices():
            if d.status == "ok" and d.mig_capable:
                try:
                    if any(i.uuid == target for i in self.backend.mig_instances(d.uuid)):
                        return d.uuid
                except BackendError:
                    continue
        return target


def _telemetry(s: GpuSample) -> GpuTelemetry:
    return {
        "uuid": s.uuid,
        "status": s.status,
        "utilization_gpu_percent": s.utilization_gpu_percent,
        "memory_used_mib": s.memory_used_mib,
        "memory_total_mib": s.memory_total_mib,
        "temperature_c": s.temperature_c,
        "power_mw": s.power_mw,
        "ecc_corrected": s.ecc_corrected,
        "ecc_uncorrected": s.ecc_uncorrected,
        "processes": [
            {
                "pid": p.pid,
                "used_memory_mib": p.used_memory_mib,
                "gpu_instance_id": p.gpu_instance_id,
                "compute_instance_id": p.compute_instance_id,
            }
            for p in s.processes
        ],
        "mig": [
            {
                "gpu_instance_id": m.gpu_instance_id,
                "compute_instance_id": m.compute_instance_id,
                "uuid": m.uuid,
                "utilization_percent": m.utilization_percent,
                "memory_used_mib": m.memory_used_mib,
                "memory_total_mib": m.memory_total_mib,
            }
            for m in s.mig
        ],
    }


def _event(e: GpuEvent) -> Event:
    return {
        "type": "event",
        "kind": e.kind,
        "gpu_uuid": e.gpu_uuid,
        "gpu_instance_id": e.gpu_instance_id,
        "xid": e.xid,
        "detail": e.detail,
        "ts": e.ts,
    }


async def ticks(interval_s: float, stop: asyncio.Event) -> AsyncIterator[int]:
    """Yield tick numbers on a monotonic deadline (no drift); end when ``stop`` is set.

    A late tick is not repeated: the next deadline is moved past ``now``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time()
    n = 0
    while not stop.is_set():
        yield n
        n += 1
        deadline += interval_s
        now = loop.time()
        if deadline < now:
            deadline = now + interval_s
        try:
            await asyncio.wait_for(stop.wait(), timeout=deadline - now)
        except TimeoutError:
            continue
