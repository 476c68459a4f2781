"""Simulated GPUs that follow the driver's MIG rules, run fake workloads and inject faults.

Built from :class:`~hostagent.protocol.SimulatedGpuSpec` values that the control plane
generates from its MIG catalog (the agent carries no catalog of its own). Everything is
deterministic from ``seed``: UUIDs, PIDs and the synthetic load of each tick.

Rules enforced like the driver (``nvml.h``, MIG user guide):

* a GPU instance needs MIG mode on; its ``start`` must be one of the profile's placements
  (else ``InvalidPlacement``, NVML INVALID_ARGUMENT); overlapping memory slices, too many
  instances of a profile, or more compute slices than the GPU has → ``InsufficientResources``;
* destroying a compute instance with processes, or a GPU instance with processes or compute
  instances → ``InUse`` with the PIDs; changing MIG mode on a busy GPU → ``InUse``;
* utilisation is ``None`` on a MIG-enabled GPU; per-instance utilisation is ``None`` on Ampere
  (A100/A30) and a GPM-like value on Hopper and later.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass, field

from hostagent.gpu.backend import (
    BackendError,
    GpuDevice,
    GpuEvent,
    GpuLost,
    GpuSample,
    InsufficientResources,
    InUse,
    InvalidPlacement,
    MigInstance,
    MigModeResult,
    MigSample,
    NotFound,
    NotSupported,
    ProcessSample,
    ProfilePlacements,
)
from hostagent.mps import MpsDaemon, MpsError
from hostagent.protocol import EventKind, SimulatedGpuSpec, SimulatedProfileSpec

logger = logging.getLogger(__name__)

AMPERE_MARKERS = ("A100", "A30")
BASELINE_MEMORY_MIB = 0


def _uuid(seed: int, *parts: object) -> str:
    digest = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return str(uuidlib.UUID(bytes=digest[:16], version=4))


def is_ampere(name: str) -> bool:
    """Ampere MIG GPUs have no per-instance utilisation in NVML (no GPM)."""
    return any(marker in name for marker in AMPERE_MARKERS)


@dataclass(frozen=True)
class RunningAllocation:
    """A workload the simulator should run: on a MIG instance or on the whole GPU."""

    key: str
    gpu_instance_id: int | None
    memory_mib: int
    compute_percent: int = 100


@dataclass
class _Process:
    pid: int
    memory_mib: int
    compute_percent: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    key: str | None


@dataclass
class _GpuInstance:
    gpu_instance_id: int
    profile: SimulatedProfileSpec
    start: int
    compute_instances: dict[int, str] = field(default_factory=dict)


@dataclass
class _Gpu:
    index: int
    uuid: str
    spec: SimulatedGpuSpec
    mig_current: bool = False
    mig_pending: bool = False
    lost: bool = False
    instances: dict[int, _GpuInstance] = field(default_factory=dict)
    processes: dict[int, _Process] = field(default_factory=dict)
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    ticks: int = 0
    created: int = 0


class SimulatedMpsControl:
    """MPS daemons kept in memory; :meth:`SimulatedBackend.crash_mps` kills them."""

    def __init__(self) -> None:
        self._running: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def start(self, daemon: MpsDaemon) -> None:
        """Mark the daemon for ``daemon.target_uuid`` as running."""
        with self._lock:
            self._running.setdefault(daemon.target_uuid, {})

    def stop(self, daemon: MpsDaemon) -> None:
        """Forget the daemon."""
        with self._lock:
            self._running.pop(daemon.target_uuid, None)

    def is_running(self, daemon: MpsDaemon) -> bool:
        """True if started and not crashed."""
        with self._lock:
            return daemon.target_uuid in self._running

    def command(self, daemon: MpsDaemon, line: str) -> str:
        """Answer ``set_*``/``get_*`` commands like the control daemon does."""
        with self._lock:
            settings = self._running.get(daemon.target_uuid)
            if settings is None:
                raise MpsError(f"no MPS daemon for {daemon.target_uuid}")
            words = line.split()
            if words[0].startswith("set_"):
                settings[words[0][4:]] = " ".join(words[1:])
                return ""
            if words[0] == "get_default_active_thread_percentage":
                return settings.get("default_active_thread_percentage", "100.0")
            return settings.get(words[0][4:], "")

    def crash(self, target_uuids: list[str]) -> None:
        """Kill the daemons of these targets (fault injection)."""
        with self._lock:
            for target in target_uuids:
                self._running.pop(target, None)


class SimulatedBackend:
    """A :class:`~hostagent.gpu.backend.GpuBackend` over in-memory GPUs."""

    kind = "simulated"

    def __init__(
        self,
        specs: list[SimulatedGpuSpec],
        seed: int = 0,
        *,
        mig_change_needs_reset: bool = False,
        driver_version: str = "580.65.06",
        nvml_version: str = "13.580.65",
    ) -> None:
        self.seed = seed
        self.mig_change_needs_reset = mig_change_needs_reset
        self._driver_version = driver_version
        self._nvml_version = nvml_version
        self._gpus = [
            _Gpu(index=i, uuid=spec.get("uuid") or "GPU-" + _uuid(seed, "gpu", i), spec=spec)
            for i, spec in enumerate(specs)
        ]
        self._by_uuid = {gpu.uuid: gpu for gpu in self._gpus}
        self._events: list[GpuEvent] = []
        self._cond = threading.Condition()
        self._lock = threading.RLock()
        self._next_pid = 10_000 + random.Random(seed).randrange(50_000)
        self._slow_apply_s = 0.0
        self._fail_next = 0
        self.mps_control = SimulatedMpsControl()
        self._initialised = False

    # -- lifecycle -------------------------------------------------------------------------

    def init(self) -> None:
        """Nothing to load; marks the backend available."""
        self._initialised = True

    def shutdown(self) -> None:
        """Marks the backend unavailable."""
        self._initialised = False

    def available(self) -> bool:
        """True after :meth:`init`."""
        return self._initialised

    def driver_version(self) -> str | None:
        """The simulated driver version."""
        return self._driver_version

    def nvml_version(self) -> str | None:
        """The simulated NVML version."""
        return self._nvml_version

    # -- discovery -------------------------------------------------------------------------

    def _gpu(self, gpu: str, *, allow_lost: bool = False) -> _Gpu:
        found = self._by_uuid.get(gpu)
        if found is None:
            raise NotFound(f"no GPU {gpu}")
        if found.lost and not allow_lost:
            raise GpuLost(f"GPU {gpu} is lost")
        return found

    def list_gpus(self) -> list[GpuDevice]:
        """Every simulated GPU; lost ones with ``status="lost"``."""
        with self._lock:
            return [self._device(g) for g in self._gpus]

    def _device(self, g: _Gpu) -> GpuDevice:
        capable = g.spec["mig_capable"]
        return GpuDevice(
            index=g.index,
            uuid=g.uuid,
            name=g.spec["name"],
            pci_device_id=g.spec["pci_device_id"],
            memory_total_mib=g.spec["memory_mib"],
            mig_capable=capable,
            mig_mode_current=g.mig_current if capable else None,
            mig_mode_pending=g.mig_pending if capable else None,
            status="lost" if g.lost else "ok",
        )

    def possible_placements(self, gpu: str) -> list[ProfilePlacements]:
        """Profiles and placements from the spec (valid whether MIG is on or not, as NVML)."""
        g = self._gpu(gpu)
        return [
            ProfilePlacements(
                profile_id=p["id"],
                name=p["name"],
                compute_slices=p["compute_slices"],
                memory_slices=p["memory_slices"],
                memory_mib=p["memory_mib"],
                max_instances=p["max_instances"],
                placements=tuple((s, z) for s, z in p["placements"]),
            )
            for p in g.spec["profiles"]
        ]

    def mig_instances(self, gpu: str) -> list[MigInstance]:
        """GPU instances (one entry per compute instance, or one with ``None`` if it has none)."""
        with self._lock:
            g = self._gpu(gpu)
            out: list[MigInstance] = []
            for gi in sorted(g.instances.values(), key=lambda i: i.start):
                base = MigInstance(
                    gpu_instance_id=gi.gpu_instance_id,
                    profile_id=gi.profile["id"],
                    start=gi.start,
                    size=gi.profile["memory_slices"],
                    memory_mib=gi.profile["memory_mib"],
                )
                if not gi.compute_instances:
                    out.append(base)
                for ci_id, mig_uuid in sorted(gi.compute_instances.items()):
                    out.append(
                        MigInstance(
                            gpu_instance_id=base.gpu_instance_id,
                            profile_id=base.profile_id,
                            start=base.start,
                            size=base.size,
                            compute_instance_id=ci_id,
                            uuid=mig_uuid,
                            memory_mib=base.memory_mib,
                        )
                    )
            return out

    # -- mutations -------------------------------------------------------------------------

    def _mutation(self) -> None:
        if self._slow_apply_s:
            time.sleep(self._slow_apply_s)
        if self._fail_next > 0:
            self._fail_next -= 1
            raise BackendError("injected failure (fail_apply)")

    def set_mig_mode(self, gpu: str, enabled: bool) -> MigModeResult:
        """``nvidia-smi -i GPU -mig 0|1``: busy GPU or existing instances → InUse."""
        with self._lock:
            g = self._gpu(gpu)
            if not g.spec["mig_capable"]:
                raise NotSupported(f"{g.spec['name']} is not MIG capable")
            self._mutation()
            if g.processes:
                raise InUse("processes run on the GPU", tuple(sorted(g.processes)))
            if g.instances and not enabled:
                raise InUse("GPU instances exist; destroy them first")
            g.mig_pending = enabled
            if self.mig_change_needs_reset and g.mig_current != enabled:
                return MigModeResult(ok=True, needs_reset=True)
            g.mig_current = enabled
            return MigModeResult(ok=True, needs_reset=False)

    def reset_gpu(self, gpu: str) -> None:
        """What a GPU reset (or a reboot) does: a pending MIG mode applies; processes, MPS
        daemons and MIG instances are gone (the MIG mode itself persists, as on real GPUs)."""
        self.crash_mps(gpu)
        with self._lock:
            g = self._gpu(gpu)
            g.mig_current = g.mig_pending
            g.processes.clear()
            g.instances.clear()

    def _profile(self, g: _Gpu, profile_id: int) -> SimulatedProfileSpec:
        for p in g.spec["profiles"]:
            if p["id"] == profile_id:
                return p
        raise InvalidPlacement(f"profile {profile_id} is not supported on {g.spec['name']}")

    def create_gpu_instance(self, gpu: str, profile_id: int, start: int) -> MigInstance:
        """``nvmlDeviceCreateGpuInstanceWithPlacement`` with the driver's checks."""
        with self._lock:
            g = self._gpu(gpu)
            if not g.mig_current:
                raise NotSupported("MIG mode is disabled")
            profile = self._profile(g, profile_id)
            if [start, profile["memory_slices"]] not in [list(p) for p in profile["placements"]]:
                raise InvalidPlacement(f"profile {profile_id} cannot start at {start}")
            self._mutation()
            self._check_fits(g, profile, start)
            gi_id = min(set(range(1, len(g.instances) + 2)) - set(g.instances))
            g.instances[gi_id] = _GpuInstance(gi_id, profile, start)
            return MigInstance(
                gpu_instance_id=gi_id,
                profile_id=profile_id,
                start=start,
                size=profile["memory_slices"],
                memory_mib=profile["memory_mib"],
            )

    def _check_fits(self, g: _Gpu, profile: SimulatedProfileSpec, start: int) -> None:
        end = start + profile["memory_slices"]
        same = [gi for gi in g.instances.values() if gi.profile["id"] == profile["id"]]
        if len(same) >= profile["max_instances"]:
            raise InsufficientResources(f"profile {profile['id']} is at its maximum")
        for gi in g.instances.values():
            if start < gi.start + gi.profile["memory_slices"] and gi.start < end:
                raise InsufficientResources(
                    f"slices {start}..{end} overlap GI {gi.gpu_instance_id}"
                )
        used = sum(gi.profile["compute_slices"] for gi in g.instances.values())
        if used + profile["compute_slices"] > g.spec["compute_slice_count"]:
            raise InsufficientResources("no compute slices left")

    def create_compute_instance(self, gpu: str, gpu_instance_id: int) -> MigInstance:
        """Default full-size compute instance (``nvidia-smi mig -cci -gi ID``)."""
        with self._lock:
            g = self._gpu(gpu)
            gi = g.instances.get(gpu_instance_id)
            if gi is None:
                raise NotFound(f"no GPU instance {gpu_instance_id}")
            if gi.compute_instances:
                raise InsufficientResources("the GPU instance already has a compute instance")
            self._mutation()
            g.created += 1
            mig_uuid = "MIG-" + _uuid(self.seed, g.uuid, gpu_instance_id, 0, g.created)
            gi.compute_instances[0] = mig_uuid
            return MigInstance(
                gpu_instance_id=gpu_instance_id,
                profile_id=gi.profile["id"],
                start=gi.start,
                size=gi.profile["memory_slices"],
                compute_instance_id=0,
                uuid=mig_uuid,
                memory_mib=gi.profile["memory_mib"],
            )

    def destroy_compute_instance(
        self, gpu: str, gpu_instance_id: int, compute_instance_id: int
    ) -> None:
        """``nvmlComputeInstanceDestroy``: InUse with PIDs if processes run on it."""
        with self._lock:
            g = self._gpu(gpu)
            gi = g.instances.get(gpu_instance_id)
            if gi is None or compute_instance_id not in gi.compute_instances:
                raise NotFound(f"no compute instance {gpu_instance_id}/{compute_instance_id}")
            pids = self._pids(g, gpu_instance_id, compute_instance_id)
            if pids:
                raise InUse("processes run on the compute instance", pids)
            self._mutation()
            del gi.compute_instances[compute_instance_id]

    def destroy_gpu_instance(self, gpu: str, gpu_instance_id: int) -> None:
        """``nvmlGpuInstanceDestroy``: InUse if processes or compute instances remain."""
        with self._lock:
            g = self._gpu(gpu)
            gi = g.instances.get(gpu_instance_id)
            if gi is None:
                raise NotFound(f"no GPU instance {gpu_instance_id}")
            pids = self._pids(g, gpu_instance_id, None)
            if pids:
                raise InUse("processes run on the GPU instance", pids)
            if gi.compute_instances:
                raise InUse("compute instances exist on the GPU instance")
            self._mutation()
            del g.instances[gpu_instance_id]

    @staticmethod
    def _pids(g: _Gpu, gi: int | None, ci: int | None) -> tuple[int, ...]:
        return tuple(
            sorted(
                p.pid
                for p in g.processes.values()
                if p.gpu_instance_id == gi and (ci is None or p.compute_instance_id == ci)
            )
        )

    # -- workloads -------------------------------------------------------------------------

    def run_process(
        self,
        gpu: str,
        memory_mib: int,
        *,
        gpu_instance_id: int | None = None,
        compute_percent: int = 100,
        key: str | None = None,
    ) -> int:
        """Start a fake CUDA process on the GPU or in a MIG instance; return its PID."""
        with self._lock:
            g = self._gpu(gpu)
            ci: int | None = None
            if gpu_instance_id is not None:
                gi = g.instances.get(gpu_instance_id)
                if gi is None or not gi.compute_instances:
                    raise NotFound(f"no usable MIG instance {gpu_instance_id}")
                ci = min(gi.compute_instances)
            pid = self._next_pid
            self._next_pid += 1
            g.processes[pid] = _Process(pid, memory_mib, compute_percent, gpu_instance_id, ci, key)
            return pid

    def kill_process(self, pid: int) -> None:
        """End a fake process (no error if it is gone)."""
        with self._lock:
            for g in self._gpus:
                g.processes.pop(pid, None)

    def sync_allocations(self, gpu: str, allocations: list[RunningAllocation]) -> list[str]:
        """Make the keyed fake processes match ``allocations``; return keys not placeable.

        Processes whose key is not listed end; listed allocations without a process start on
        their MIG instance (or the whole GPU), unless that instance does not exist yet.
        """
        with self._lock:
            g = self._gpu(gpu)
            wanted = {a.key: a for a in allocations}
            for p in list(g.processes.values()):
                if p.key is not None and p.key not in wanted:
                    del g.processes[p.pid]
            running = {p.key for p in g.processes.values()}
            unplaced = []
            for a in allocations:
                if a.key in running:
                    continue
                try:
                    self.run_process(
                        gpu,
                        a.memory_mib,
                        gpu_instance_id=a.gpu_instance_id,
                        compute_percent=a.compute_percent,
                        key=a.key,
                    )
                except NotFound:
                    unplaced.append(a.key)
            return unplaced

    def process_keys(self, gpu: str) -> dict[str, int]:
        """Allocation key → PID of the fake processes started with a key."""
        with self._lock:
            g = self._gpu(gpu, allow_lost=True)
            return {p.key: p.pid for p in g.processes.values() if p.key is not None}

    def processes(self, gpu: str) -> list[ProcessSample]:
        """The fake processes (``nvmlDeviceGetComputeRunningProcesses``)."""
        with self._lock:
            g = self._gpu(gpu)
            return [
                ProcessSample(p.pid, p.memory_mib, p.gpu_instance_id, p.compute_instance_id)
                for p in sorted(g.processes.values(), key=lambda p: p.pid)
            ]

    # -- telemetry -------------------------------------------------------------------------

    def _load(self, g: _Gpu, procs: list[_Process], capacity: int) -> float:
        rng = random.Random(f"{self.seed}:{g.uuid}:{g.ticks}")
        if not procs:
            return 0.0
        busy = sum(p.compute_percent * (0.6 + 0.4 * rng.random()) for p in procs)
        return round(min(100.0, busy / max(capacity, 1)), 1)

    def sample(self, gpu: str) -> GpuSample:
        """Synthetic load from the running fake processes, deterministic from seed and tick."""
        with self._lock:
            g = self._gpu(gpu, allow_lost=True)
            if g.lost:
                return GpuSample(uuid=g.uuid, status="lost")
            g.ticks += 1
            procs = list(g.processes.values())
            load = self._load(g, procs, 1)
            used = BASELINE_MEMORY_MIB + sum(p.memory_mib for p in procs)
            return GpuSample(
                uuid=g.uuid,
                status="ok",
                utilization_gpu_percent=None if g.mig_current else load,
                memory_used_mib=used,
                memory_total_mib=g.spec["memory_mib"],
                temperature_c=int(32 + load * 0.4),
                power_mw=int(60_000 + load * 3_000),
                ecc_corrected=g.ecc_corrected,
                ecc_uncorrected=g.ecc_uncorrected,
                processes=tuple(self.processes(gpu)),
                mig=tuple(self._mig_samples(g)),
            )

    def _mig_samples(self, g: _Gpu) -> list[MigSample]:
        out = []
        for gi in sorted(g.instances.values(), key=lambda i: i.start):
            procs = [p for p in g.processes.values() if p.gpu_instance_id == gi.gpu_instance_id]
            util = None if is_ampere(g.spec["name"]) else self._load(g, procs, 1)
            for ci_id, mig_uuid in sorted(gi.compute_instances.items()):
                out.append(
                    MigSample(
                        gpu_instance_id=gi.gpu_instance_id,
                        compute_instance_id=ci_id,
                        uuid=mig_uuid,
                        utilization_percent=util,
                        memory_used_mib=sum(p.memory_mib for p in procs),
                        memory_total_mib=gi.profile["memory_mib"],
                    )
                )
        return out

    # -- events and faults -----------------------------------------------------------------

    def _emit(self, kind: EventKind, g: _Gpu, detail: str, **extra: int | None) -> None:
        event = GpuEvent(kind=kind, gpu_uuid=g.uuid, detail=detail, ts=time.time(), **extra)
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    def wait_events(self, timeout_ms: int) -> list[GpuEvent]:
        """Return queued events, waiting up to ``timeout_ms`` for the first one."""
        with self._cond:
            if not self._events and timeout_ms > 0:
                self._cond.wait(timeout_ms / 1000)
            events, self._events = self._events, []
            return events

    def inject_xid(self, gpu: str, xid: int, gpu_instance_id: int | None = None) -> None:
        """Raise an Xid critical error event (``nvmlEventTypeXidCriticalError``)."""
        g = self._gpu(gpu, allow_lost=True)
        self._emit("xid", g, f"Xid {xid}", xid=xid, gpu_instance_id=gpu_instance_id)

    def inject_ecc(self, gpu: str, uncorrected: int = 0, corrected: int = 0) -> None:
        """Add ECC errors to the counters and raise an ``ecc`` event."""
        with self._lock:
            g = self._gpu(gpu, allow_lost=True)
            g.ecc_uncorrected += uncorrected
            g.ecc_corrected += corrected
        self._emit("ecc", g, f"ECC errors: {uncorrected} uncorrected, {corrected} corrected")

    def lose_gpu(self, gpu: str) -> None:
        """The GPU falls off the bus (NVML GPU_IS_LOST from now on).

        Like NVML, no event is queued: the collector reports ``gpu_lost``/``gpu_back`` from the
        status change it observes.
        """
        with self._lock:
            g = self._gpu(gpu, allow_lost=True)
            g.lost = True

    def restore_gpu(self, gpu: str) -> None:
        """The GPU is back."""
        with self._lock:
            g = self._gpu(gpu, allow_lost=True)
            g.lost = False

    def crash_mps(self, gpu: str) -> None:
        """Kill the MPS daemons of the GPU and of its MIG instances."""
        with self._lock:
            g = self._gpu(gpu, allow_lost=True)
            targets = [g.uuid] + [
                u for gi in g.instances.values() for u in gi.compute_instances.values()
            ]
        self.mps_control.crash(targets)

    def slow_apply(self, seconds: float) -> None:
        """Every later mutation sleeps ``seconds`` first (0 turns it off)."""
        self._slow_apply_s = seconds

    def fail_apply(self, next_n: int) -> None:
        """The next ``next_n`` mutations raise a backend error."""
        self._fail_next = next_n
