"""The simulator's fake CUDA processes (MPS clients and servers included), telemetry, events and
injected faults, as a base class of :class:`~hostagent.gpu.simulated.SimulatedBackend`."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from hostagent.gpu.backend import (
    BackendError,
    GpuEvent,
    GpuLost,
    GpuSample,
    MigSample,
    NotFound,
    ProcessSample,
)
from hostagent.gpu.simulated.model import (
    BASELINE_MEMORY_MIB,
    Gpu,
    Process,
    RunningAllocation,
    is_ampere,
)
from hostagent.gpu.simulated.mps import SimulatedMpsControl
from hostagent.mps import MpsDaemon, MpsLimits
from hostagent.protocol import EventKind

logger = logging.getLogger(__name__)

_NOWHERE = Path("/nonexistent")
"""Simulated daemons are keyed by their target only; no directory is touched."""


class Workloads:
    """Processes, telemetry, events and faults over the backend's GPUs (state set by it)."""

    seed: int
    mps_control: SimulatedMpsControl
    _gpus: list[Gpu]
    _by_uuid: dict[str, Gpu]
    _lock: threading.RLock
    _cond: threading.Condition
    _events: list[GpuEvent]
    _next_pid: int
    _slow_apply_s: float
    _fail_next: int

    def _gpu(self, gpu: str, *, allow_lost: bool = False) -> Gpu:
        found = self._by_uuid.get(gpu)
        if found is None:
            raise NotFound(f"no GPU {gpu}")
        if found.lost and not allow_lost:
            raise GpuLost(f"GPU {gpu} is lost")
        return found

    def _mutation(self) -> None:
        if self._slow_apply_s:
            time.sleep(self._slow_apply_s)
        if self._fail_next > 0:
            self._fail_next -= 1
            raise BackendError("injected failure (fail_apply)")

    def _new_pid(self) -> int:
        pid = self._next_pid
        self._next_pid += 1
        return pid

    # -- processes and MPS -------------------------------------------------------------------

    def _target(self, g: Gpu, gpu_instance_id: int | None) -> tuple[str, int | None]:
        """The MPS target (GPU or MIG UUID) a process runs on, and its compute instance."""
        if gpu_instance_id is None:
            return g.uuid, None
        gi = g.instances.get(gpu_instance_id)
        if gi is None or not gi.compute_instances:
            raise NotFound(f"no usable MIG instance {gpu_instance_id}")
        ci = min(gi.compute_instances)
        return gi.compute_instances[ci], ci

    def run_process(
        self,
        gpu: str,
        memory_mib: int,
        *,
        gpu_instance_id: int | None = None,
        compute_percent: int = 100,
        key: str | None = None,
        mps: bool | None = None,
        uid: int = 0,
        env: Mapping[str, str] | None = None,
    ) -> int:
        """Start a fake CUDA process of ``uid`` on the GPU or in a MIG instance; its PID.

        It runs through MPS when a daemon runs on its target (``mps=None``), as CUDA connects
        to the daemon at init; ``mps=True`` starts a daemon there first, ``False`` never. As an
        MPS client it gets its server's limits, lowered by the ``CUDA_MPS_*`` of ``env`` (the
        environment it has at CUDA init, re-exports included): see :meth:`mps_limits`.

        Raises:
            MpsQueued: the daemon's server belongs to another UID and has clients.
        """
        with self._lock:
            g = self._gpu(gpu)
            target, ci = self._target(g, gpu_instance_id)
            if mps:
                self.mps_control.start(MpsDaemon(target, _NOWHERE, _NOWHERE))
            server = None
            if mps is not False:
                server = self.mps_control.connect(target, self._new_pid, uid)
            limits = self.mps_control.client_limits(target, env or {}) if server else None
            pid = self._new_pid()
            g.processes[pid] = Process(
                pid, memory_mib, compute_percent, gpu_instance_id, ci, key, target, server, limits
            )
            return pid

    def mps_limits(self, pid: int) -> MpsLimits | None:
        """The limits an MPS client runs under (``None``: not an MPS client)."""
        with self._lock:
            for g in self._gpus:
                p = g.processes.get(pid)
                if p is not None:
                    return p.mps_limits if self._is_client(p) else None
            return None

    def start_mps_server(self, gpu: str, *, gpu_instance_id: int | None = None) -> int:
        """Start an MPS daemon on the GPU or MIG instance and its ``nvidia-cuda-mps-server``
        (as a first client would); return the server's PID."""
        with self._lock:
            target, _ = self._target(self._gpu(gpu), gpu_instance_id)
            self.mps_control.start(MpsDaemon(target, _NOWHERE, _NOWHERE))
            server = self.mps_control.connect(target, self._new_pid)
            assert server is not None  # the daemon was just started
            return server

    def _is_client(self, p: Process) -> bool:
        return (
            p.mps_server is not None
            and p.mps_target is not None
            and self.mps_control.server_pid(p.mps_target) == p.mps_server
        )

    def _mps_clients(self, target: str, server: int) -> tuple[int, ...]:
        with self._lock:
            return tuple(
                sorted(
                    p.pid
                    for g in self._gpus
                    for p in g.processes.values()
                    if p.mps_target == target and p.mps_server == server and self._is_client(p)
                )
            )

    def _servers(self, g: Gpu) -> list[tuple[int, int | None, int | None]]:
        """``(pid, gi, ci)`` of every MPS server on the GPU and its MIG instances."""
        out = []
        for target, gi, ci in g.targets():
            pid = self.mps_control.server_pid(target)
            if pid is not None:
                out.append((pid, gi, ci))
        return out

    def _busy_pids(
        self, g: Gpu, gpu_instance_id: int | None = None, compute_instance_id: int | None = None
    ) -> tuple[int, ...]:
        """Processes and MPS servers on the GPU (``gpu_instance_id`` None) or on one GI/CI: the
        driver counts the server as a process (review D5)."""
        found = [(p.pid, p.gpu_instance_id, p.compute_instance_id) for p in g.processes.values()]
        found += self._servers(g)
        return tuple(
            sorted(
                pid
                for pid, gi, ci in found
                if gpu_instance_id is None
                or (gi == gpu_instance_id and compute_instance_id in (None, ci))
            )
        )

    def kill_process(self, pid: int) -> None:
        """End a fake process (no error if it is gone); an MPS server stays up, as MPS's does."""
        with self._lock:
            for g in self._gpus:
                g.processes.pop(pid, None)

    def sync_allocations(
        self, gpu: str, allocations: list[RunningAllocation], *, start: bool = True
    ) -> list[str]:
        """Make the keyed fake processes match ``allocations``; return keys not placeable.

        Processes whose key is not listed end; with ``start``, listed allocations without a
        process start on their MIG instance (or the whole GPU), unless it does not exist yet.
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
                if a.key in running or not start:
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
        """The fake processes (``nvmlDeviceGetComputeRunningProcesses``), MPS clients as
        ``mps_client`` (``nvmlDeviceGetMPSComputeRunningProcesses``) and each running
        ``nvidia-cuda-mps-server`` as ``mps_server``."""
        with self._lock:
            g = self._gpu(gpu)
            out = [
                ProcessSample(
                    p.pid,
                    p.memory_mib,
                    p.gpu_instance_id,
                    p.compute_instance_id,
                    kind="mps_client" if self._is_client(p) else "compute",
                )
                for p in g.processes.values()
            ]
            out += [
                ProcessSample(pid, None, gi, ci, kind="mps_server")
                for pid, gi, ci in self._servers(g)
            ]
            return sorted(out, key=lambda s: s.pid)

    # -- telemetry ---------------------------------------------------------------------------

    def _load(self, g: Gpu, procs: list[Process], capacity: int) -> float:
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

    def _mig_samples(self, g: Gpu) -> list[MigSample]:
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

    # -- events ------------------------------------------------------------------------------

    def _emit(self, kind: EventKind, g: Gpu, detail: str, **extra: int | None) -> None:
        if not g.events_registered:
            # Not registered for events (nvmlDeviceRegisterEvents failed, or a reset dropped the
            # registration): NVML never delivers it (review D7).
            g.events_lost += 1
            logger.info("simulated %s event on %s lost: not registered", kind, g.uuid)
            return
        event = GpuEvent(kind=kind, gpu_uuid=g.uuid, detail=detail, ts=time.time(), **extra)
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    def _register_events(self) -> None:
        """Each wait registers the GPUs not registered yet, as the NVML backend retries on
        every tick; an injected failure holds for its number of attempts."""
        with self._lock:
            for g in self._gpus:
                if g.events_registered or g.lost:
                    continue
                if g.registration_failures > 0:
                    g.registration_failures -= 1
                    continue
                g.events_registered = True

    def wait_events(self, timeout_ms: int) -> list[GpuEvent]:
        """Return queued events, waiting up to ``timeout_ms`` for the first one."""
        self._register_events()
        with self._cond:
            if not self._events and timeout_ms > 0:
                self._cond.wait(timeout_ms / 1000)
            events, self._events = self._events, []
            return events

    def events_lost(self, gpu: str) -> int:
        """How many events of the GPU were lost while it was not registered."""
        with self._lock:
            return self._gpu(gpu, allow_lost=True).events_lost

    # -- faults ------------------------------------------------------------------------------

    def fail_event_registration(self, gpu: str, attempts: int = 1) -> None:
        """The GPU's event registration is gone and fails ``attempts`` more times
        (``nvmlDeviceRegisterEvents`` UNKNOWN); its events are lost meanwhile."""
        with self._lock:
            g = self._gpu(gpu, allow_lost=True)
            g.events_registered = False
            g.registration_failures = attempts

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
        """Kill the MPS daemons (and servers) of the GPU and of its MIG instances; their
        clients run on without MPS."""
        with self._lock:
            g = self._gpu(gpu, allow_lost=True)
            self.mps_control.crash([target for target, _, _ in g.targets()])

    def slow_apply(self, seconds: float) -> None:
        """Every later mutation sleeps ``seconds`` first (0 turns it off)."""
        self._slow_apply_s = seconds

    def fail_apply(self, next_n: int) -> None:
        """The next ``next_n`` mutations raise a backend error."""
        self._fail_next = next_n
