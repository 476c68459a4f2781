"""Builds ``hello``, ``telemetry`` and ``event`` messages from a backend (and the MPS manager).

Health events come from three places: the backend (Xid and ECC through ``nvmlEventSetWait``),
GPU status changes seen between ticks (``gpu_lost`` / ``gpu_back``), and MPS daemon health
changes (``mps_down`` / ``mps_up``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from hostagent import __version__
from hostagent.gpu.backend import (
    BackendError,
    GpuBackend,
    GpuDevice,
    GpuEvent,
    GpuLost,
    GpuSample,
    GpuUnavailable,
)
from hostagent.logs import FailureLog
from hostagent.mps import MpsManager
from hostagent.mps_health import MPS_HEALTH_EVERY_S, MpsHealth
from hostagent.protocol import (
    PROTOCOL_VERSION,
    AgentRuntime,
    BackendKind,
    Event,
    EventKind,
    GpuInfo,
    GpuStatus,
    GpuTelemetry,
    Hello,
    MpsState,
    PlacementProfile,
    ReplicaMetric,
    Telemetry,
    UpMessage,
    clip,
    empty_mps_state,
)
from hostagent.wire import clip_or_none, event_of, mib, telemetry_of

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0
REINIT_EVERY_S = 30.0

Owners = Callable[[str, list[int]], dict[int, int]]
"""``(gpu uuid, pids) -> {pid: allocation id}``: which replica each process belongs to."""


class Collector:
    """Reads a backend into wire messages; keeps what it needs to detect transitions.

    Every public method is safe to call from a worker thread, and does not raise: an error of
    the driver (or a bug) costs the GPU or the field it concerns for one tick, never the
    heartbeat (review D1). Calls are serialised by a lock of the collector's own, not by the
    agent's apply lock, so telemetry flows while an apply runs (review D11). ``threads=False``
    runs MPS health checks in the caller (the swarm's simulated daemons).
    """

    def __init__(
        self,
        backend: GpuBackend,
        *,
        hostname: str,
        mps: MpsManager | None = None,
        allow_mutation: bool = False,
        mps_health_every_s: float = MPS_HEALTH_EVERY_S,
        threads: bool = True,
        runtime: AgentRuntime = "none",
        owners: Owners | None = None,
        process_runtime: bool = False,
        address: str | None = None,
        metrics: Callable[[], list[ReplicaMetric]] | None = None,
    ) -> None:
        self.backend = backend
        self.mps = mps
        self.hostname = hostname
        self.allow_mutation = allow_mutation
        self.runtime: AgentRuntime = runtime
        self.process_runtime = process_runtime and runtime != "none"
        self.owners = owners
        self.address = address
        # The latest readings of the replicas' own metrics (hostagent.runtime.metrics).
        self.metrics = metrics
        # Set while an apply runs: it may have released NVML on purpose (the Ampere reset path),
        # and a telemetry thread initialising it again would hold the GPU the reset needs.
        self.applying = threading.Event()
        self._lock = threading.RLock()
        self._log = FailureLog(logger)
        self._status: dict[str, GpuStatus] = {}
        self._known: list[GpuDevice] = []
        self._mps_health: dict[str, bool] = {}
        self._health = (
            MpsHealth(mps, self._log, mps_health_every_s, threads=threads) if mps else None
        )
        self._last_init_attempt = -REINIT_EVERY_S

    def close(self) -> None:
        """Release the MPS health-check threads."""
        if self._health is not None:
            self._health.close()

    def recheck_mps(self) -> None:
        """Check MPS health at the next tick (an apply changed the daemons)."""
        if self._health is not None:
            self._health.recheck()

    def ensure_backend(self) -> bool:
        """Initialise the backend if needed, retrying at most every 30 s; True if available."""
        if self.backend.available():
            return True
        now = time.monotonic()
        if self.applying.is_set() or now - self._last_init_attempt < REINIT_EVERY_S:
            return False
        self._last_init_attempt = now
        try:
            self.backend.init()
        except GpuUnavailable as exc:
            self._log.failure("initialising the GPU driver", exc)
            return False
        except Exception as exc:  # 18 (driver/library mismatch), NVMLLibraryMismatchError: D1
            self._log.failure("initialising the GPU driver", exc, expected=_expected(exc))
            return False
        return True

    def _devices(self) -> list[GpuDevice]:
        """The GPUs, enumerated once; if enumeration fails, the last known GPUs, unavailable."""
        if not self.ensure_backend():
            return []
        try:
            devices = self.backend.list_gpus()
        except Exception as exc:  # 999 from nvmlDeviceGetCount, a driver gone: D1
            self._log.failure("listing the GPUs", exc, expected=_expected(exc))
            return [_unreadable(d) for d in self._known]
        self._known = devices
        return devices

    def gpu_infos(self) -> list[GpuInfo]:
        """The ``gpus`` part of ``hello`` and of ``ack.observed``."""
        with self._lock:
            return [self._info(d) for d in self._devices()]

    def _info(self, d: GpuDevice) -> GpuInfo:
        placements: dict[str, PlacementProfile] = {}
        instances = []
        if d.status == "ok" and d.mig_capable:
            try:
                for p in self.backend.possible_placements(d.uuid):
                    placements[str(p.profile_id)] = {
                        "profile_id": p.profile_id,
                        "name": clip(p.name),
                        "compute_slices": p.compute_slices,
                        "memory_slices": p.memory_slices,
                        "memory_mib": mib(p.memory_mib) or 0,
                        "max_instances": p.max_instances,
                        "placements": [[s, z] for s, z in p.placements],
                    }
                instances = self.backend.mig_instances(d.uuid)
            except Exception as exc:
                self._log.failure(f"MIG discovery of {d.uuid}", exc, expected=_expected(exc))
        return {
            "index": d.index,
            "uuid": d.uuid,
            "name": clip(d.name),
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
        try:
            managed = set(self.mps.managed_targets())
            if gpu in managed:
                info = self.mps.info(gpu)
                state["running"] = info["running"]
                state["healthy"] = info["healthy"]
                state["pipe_directory"] = info["pipe_directory"]
                state["default_active_thread_percentage"] = info["default_active_thread_percentage"]
                state["default_pinned_mem_limit_mib"] = info["default_pinned_mem_limit_mib"]
            state["instances"] = [self.mps.info(u) for u in mig_uuids if u in managed]
        except Exception as exc:
            self._log.failure(f"reading the MPS state of {gpu}", exc, expected=False)
        return state

    def hello(self, applied_generation: int) -> Hello:
        """The ``hello`` message."""
        gpus = self.gpu_infos()
        kind: BackendKind = "nvml" if self.backend.kind == "nvml" else "simulated"
        driver, nvml = self._versions()
        hello: Hello = {
            "type": "hello",
            "protocol": PROTOCOL_VERSION,
            "agent_version": clip(__version__),
            "hostname": clip(self.hostname),
            "backend": kind,
            "allow_mutation": self.allow_mutation,
            "driver_version": driver,
            "nvml_version": nvml,
            "applied_generation": applied_generation,
            "gpus": gpus,
            "runtime": self.runtime,
            "process_runtime": self.process_runtime,
        }
        if self.address:
            hello["address"] = clip(self.address, 253)
        return hello

    def _versions(self) -> tuple[str | None, str | None]:
        """Driver and NVML versions (``nvmlSystemGetDriverVersion``/``…NVMLVersion``)."""
        if not self.backend.available():
            return None, None
        try:
            driver, nvml = self.backend.driver_version(), self.backend.nvml_version()
        except Exception as exc:
            self._log.failure("reading the driver version", exc, expected=_expected(exc))
            return None, None
        return clip_or_none(driver), clip_or_none(nvml)

    def tick(self) -> list[UpMessage]:
        """One heartbeat: ``telemetry`` then the events since the last tick, with the GPUs
        enumerated once for both (review D11)."""
        with self._lock:
            devices = self._devices()
            return [self._telemetry(devices), *self._events(devices, 0)]

    def telemetry(self) -> Telemetry:
        """One ``telemetry`` tick (``nvidia-smi --query-gpu`` for every GPU)."""
        with self._lock:
            return self._telemetry(self._devices())

    def events(self, timeout_ms: int = 0) -> list[Event]:
        """Backend events plus GPU status and MPS health transitions since the last call."""
        with self._lock:
            return self._events(self._devices(), timeout_ms)

    def _telemetry(self, devices: list[GpuDevice]) -> Telemetry:
        gpus = [telemetry_of(self._sample(d)) for d in devices]
        if self.owners is not None:
            for gpu in gpus:
                self._attribute(gpu)
        telemetry: Telemetry = {"type": "telemetry", "ts": time.time(), "gpus": gpus}
        if self.metrics is not None:
            try:
                readings = self.metrics()
            except Exception as exc:  # the readings are a nicety: the tick goes out without
                self._log.failure("reading the replicas' metrics", exc, expected=False)
                readings = []
            if readings:
                telemetry["replica_metrics"] = readings
        return telemetry

    def _attribute(self, gpu: GpuTelemetry) -> None:
        """Name the replica of each process (by session or PID namespace, or the simulator's
        allocation key): the GPU page shows *replica 3 of qwen-7b*, not only a PID."""
        pids = [p["pid"] for p in gpu["processes"] if p.get("kind") != "mps_server"]
        if not pids or self.owners is None:
            return
        try:
            owners = self.owners(gpu["uuid"], pids)
        except Exception as exc:  # attribution is a nicety: the sample goes out without it
            self._log.failure(f"attributing the processes of {gpu['uuid']}", exc, expected=False)
            return
        for p in gpu["processes"]:
            if p["pid"] in owners:
                p["allocation_id"] = owners[p["pid"]]

    def _sample(self, d: GpuDevice) -> GpuSample:
        """One GPU's sample; ``lost`` or ``unavailable`` (and no values) if it cannot be read."""
        if d.status == "unavailable":
            return GpuSample(uuid=d.uuid, status="unavailable")
        try:
            return self.backend.sample(d.uuid)
        except GpuLost:
            return GpuSample(uuid=d.uuid, status="lost")
        except Exception as exc:  # 999, NO_PERMISSION, a GI destroyed by a running apply: D1
            self._log.failure(f"sampling {d.uuid}", exc, expected=_expected(exc))
            return GpuSample(uuid=d.uuid, status="unavailable")

    def _events(self, devices: list[GpuDevice], timeout_ms: int) -> list[Event]:
        events = self._backend_events(timeout_ms)
        events.extend(self._status_events(devices))
        events.extend(self._mps_events(devices))
        return [event_of(e) for e in events]

    def _backend_events(self, timeout_ms: int) -> list[GpuEvent]:
        if not self.ensure_backend():
            return []
        try:
            return list(self.backend.wait_events(timeout_ms))
        except Exception as exc:
            self._log.failure("waiting for GPU events", exc, expected=_expected(exc))
            return []

    def _status_events(self, devices: list[GpuDevice]) -> list[GpuEvent]:
        out = []
        for d in devices:
            if d.status == "unavailable":
                continue  # not known this tick: neither lost nor back
            before = self._status.get(d.uuid, "ok")
            self._status[d.uuid] = d.status
            if before == d.status:
                continue
            if d.status == "lost":
                out.append(GpuEvent("gpu_lost", d.uuid, "GPU is lost", time.time()))
            elif d.status == "ok":
                out.append(GpuEvent("gpu_back", d.uuid, "GPU is back", time.time()))
        return out

    def _mps_events(self, devices: list[GpuDevice]) -> list[GpuEvent]:
        if self.mps is None or self._health is None:
            return []
        out = []
        try:
            checked = self._health.poll()
            managed = set(self.mps.managed_targets()) if checked else set()
            for target, healthy in sorted(checked.items()):
                if target not in managed:
                    continue  # stopped while it was checked
                before = self._mps_health.get(target, True)
                self._mps_health[target] = healthy
                if healthy != before:
                    out.append(self._mps_event(target, healthy, devices))
        except Exception as exc:
            self._log.failure("checking MPS daemons", exc, expected=False)
        return out

    def _mps_event(self, target: str, healthy: bool, devices: list[GpuDevice]) -> GpuEvent:
        kind: EventKind = "mps_up" if healthy else "mps_down"
        detail = "MPS daemon answers again" if healthy else "MPS daemon does not answer"
        return GpuEvent(kind, self._gpu_of(target, devices), detail, time.time())

    def _gpu_of(self, target: str, devices: list[GpuDevice]) -> str:
        if target.startswith("GPU-"):
            return target
        for d in devices:
            if d.status == "ok" and d.mig_capable:
                try:
                    if any(i.uuid == target for i in self.backend.mig_instances(d.uuid)):
                        return d.uuid
                except Exception:  # this GPU cannot tell; another may
                    continue
        return target


def _expected(exc: BaseException) -> bool:
    """A backend error is the driver speaking; anything else is a bug worth a traceback."""
    return isinstance(exc, BackendError)


def _unreadable(d: GpuDevice) -> GpuDevice:
    return d if d.status == "lost" else replace(d, status="unavailable")


async def ticks(interval_s: float | Callable[[], float], stop: asyncio.Event) -> AsyncIterator[int]:
    """Yield tick numbers on a monotonic deadline (no drift); end when ``stop`` is set.

    ``interval_s`` may be a callable, read before each wait: the server may ask an agent to
    report less often while it is past its capacity (``pace``). A late tick is not repeated: the
    next deadline is moved past ``now``.
    """
    interval = interval_s if callable(interval_s) else (lambda: interval_s)
    loop = asyncio.get_running_loop()
    deadline = loop.time()
    n = 0
    while not stop.is_set():
        yield n
        n += 1
        step = interval()
        deadline += step
        now = loop.time()
        if deadline < now:
            deadline = now + step
        try:
            await asyncio.wait_for(stop.wait(), timeout=deadline - now)
        except TimeoutError:
            continue
