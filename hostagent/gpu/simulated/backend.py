"""The simulated :class:`~hostagent.gpu.backend.GpuBackend`: discovery, MIG and reset.

Workloads, telemetry, events and faults are in :mod:`hostagent.gpu.simulated.workloads`.
"""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path
from typing import Any

from hostagent.gpu.backend import (
    GpuDevice,
    GpuEvent,
    InsufficientResources,
    InUse,
    InvalidPlacement,
    MigInstance,
    MigModeResult,
    NotFound,
    NotSupported,
    ProfilePlacements,
)
from hostagent.gpu.simulated import persist
from hostagent.gpu.simulated.model import DriverQuirks, Gpu, GpuInstance, is_ampere, new_uuid
from hostagent.gpu.simulated.mps import SimulatedMpsControl
from hostagent.gpu.simulated.probe import probe_record
from hostagent.gpu.simulated.workloads import Workloads
from hostagent.protocol import SimulatedGpuSpec, SimulatedProfileSpec

logger = logging.getLogger(__name__)


class SimulatedBackend(Workloads):
    """A :class:`~hostagent.gpu.backend.GpuBackend` over in-memory GPUs.

    ``mig_change_needs_reset`` makes every MIG mode change wait for :meth:`reset_gpu`;
    ``quirks`` turns on the driver behaviours of real hosts (:class:`DriverQuirks`);
    ``state_file``: where the GPUs' MIG and compute modes and MIG instances are kept across a
    restart, as a real GPU keeps them (:mod:`hostagent.gpu.simulated.persist`).
    """

    kind = "simulated"

    def __init__(
        self,
        specs: list[SimulatedGpuSpec],
        seed: int = 0,
        *,
        mig_change_needs_reset: bool = False,
        quirks: DriverQuirks | None = None,
        driver_version: str = "580.65.06",
        nvml_version: str = "13.580.65",
        state_file: Path | None = None,
    ) -> None:
        self.seed = seed
        self.mig_change_needs_reset = mig_change_needs_reset
        self.quirks = quirks or DriverQuirks()
        self._driver_version = driver_version
        self._nvml_version = nvml_version
        self._gpus = [
            Gpu(index=i, uuid=spec.get("uuid") or "GPU-" + new_uuid(seed, "gpu", i), spec=spec)
            for i, spec in enumerate(specs)
        ]
        self._by_uuid = {gpu.uuid: gpu for gpu in self._gpus}
        self._state_file = state_file
        if state_file is not None:
            persist.restore(state_file, self._gpus)
        self._events: list[GpuEvent] = []
        self._cond = threading.Condition()
        self._lock = threading.RLock()
        self._next_pid = 10_000 + random.Random(seed).randrange(50_000)
        self._slow_apply_s = 0.0
        self._fail_next = 0
        self.mps_control = SimulatedMpsControl(self._lock)
        self.mps_control.clients_of = self._mps_clients
        self.mps_control.new_pid = self._new_pid
        self._initialised = False

    def _keep(self) -> None:
        """After a change of modes or instances (the lock held): the state file, if any."""
        if self._state_file is not None:
            persist.save(self._state_file, self._gpus)

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

    def probe(self) -> dict[str, Any]:
        """A read-only record shaped like the NVML backend's (``fleet-agent --probe --json``)."""
        with self._lock:
            return probe_record(self, self._gpus)

    # -- discovery -------------------------------------------------------------------------

    def list_gpus(self) -> list[GpuDevice]:
        """Every simulated GPU; lost ones with ``status="lost"``."""
        with self._lock:
            return [self._device(g) for g in self._gpus]

    def _device(self, g: Gpu) -> GpuDevice:
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
        """Profiles and placements from the spec; ``[]`` while MIG is off when the quirk
        ``hide_profiles_while_mig_off`` is on (R535-era ``GetGpuInstanceProfileInfoV``)."""
        with self._lock:
            g = self._gpu(gpu)
            if self.quirks.hide_profiles_while_mig_off and not g.mig_current:
                return []
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

    def _toggle_needs_reset(self, g: Gpu) -> bool:
        return self.mig_change_needs_reset or (
            self.quirks.ampere_mig_reset and is_ampere(g.spec["name"])
        )

    def set_mig_mode(self, gpu: str, enabled: bool) -> MigModeResult:
        """``nvidia-smi -i GPU -mig 0|1``: busy GPU or existing instances → InUse; on Ampere
        with the quirk (or ``mig_change_needs_reset``) the change is pending a GPU reset."""
        with self._lock:
            g = self._gpu(gpu)
            if not g.spec["mig_capable"]:
                raise NotSupported(f"{g.spec['name']} is not MIG capable")
            self._mutation()
            busy = self._busy_pids(g)
            if busy:
                raise InUse("processes run on the GPU", busy)
            if g.instances and not enabled:
                raise InUse("GPU instances exist; destroy them first")
            g.mig_pending = enabled
            if self._toggle_needs_reset(g) and g.mig_current != enabled:
                self._keep()
                return MigModeResult(ok=True, needs_reset=True, message=self._pending(g, enabled))
            g.mig_current = enabled
            self._keep()
            return MigModeResult(ok=True, needs_reset=False)

    def _pending(self, g: Gpu, enabled: bool) -> str:
        holders = ", ".join(self.quirks.nvml_holders) or "another NVML client"
        change = "enabling" if enabled else "disabling"
        return f"{change} MIG is pending a GPU reset: {holders} holds {g.spec['name']}"

    def reset_gpu(self, gpu: str, *, force: bool = False) -> None:
        """``nvidia-smi -r``: a pending MIG mode applies; MIG instances, MPS daemons and event
        registrations are gone; compute mode is DEFAULT again (the MIG mode itself persists).

        Raises :class:`InUse` with the PIDs while processes (MPS servers included) run on the
        GPU, as ``nvidia-smi -r`` refuses then; ``force`` (the ``reset_gpu`` fault, a reboot)
        resets anyway and ends them.
        """
        with self._lock:
            g = self._gpu(gpu)
            if not force:
                busy = self._busy_pids(g)
                if busy:
                    raise InUse("processes hold the GPU; nvidia-smi -r refused", busy)
                self._mutation()
        self.crash_mps(gpu)
        with self._lock:
            g.mig_current = g.mig_pending
            g.processes.clear()
            g.instances.clear()
            g.compute_mode = "default"
            # NVML handles and event registrations die with a reset (review D7).
            g.events_registered = False
            self._keep()

    def set_compute_mode(self, gpu: str, exclusive_process: bool) -> None:
        """``nvmlDeviceSetComputeMode``; NotSupported on a MIG-enabled GPU (MIG user guide:
        EXCLUSIVE_PROCESS "is not supported when the GPU is in MIG mode")."""
        with self._lock:
            g = self._gpu(gpu)
            if g.mig_current:
                raise NotSupported("compute mode cannot change in MIG mode")
            g.compute_mode = "exclusive_process" if exclusive_process else "default"
            self._keep()

    def compute_mode(self, gpu: str) -> str:
        """The current compute mode (``nvidia-smi -q -d COMPUTE``): ``default`` or
        ``exclusive_process``."""
        with self._lock:
            return self._gpu(gpu, allow_lost=True).compute_mode

    def _profile(self, g: Gpu, profile_id: int) -> SimulatedProfileSpec:
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
            g.instances[gi_id] = GpuInstance(gi_id, profile, start)
            self._keep()
            return MigInstance(
                gpu_instance_id=gi_id,
                profile_id=profile_id,
                start=start,
                size=profile["memory_slices"],
                memory_mib=profile["memory_mib"],
            )

    def _check_fits(self, g: Gpu, profile: SimulatedProfileSpec, start: int) -> None:
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
            mig_uuid = "MIG-" + new_uuid(self.seed, g.uuid, gpu_instance_id, 0, g.created)
            gi.compute_instances[0] = mig_uuid
            self._keep()
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
        """``nvmlComputeInstanceDestroy``: InUse with PIDs if processes (an MPS server
        included) run on it."""
        with self._lock:
            g = self._gpu(gpu)
            gi = g.instances.get(gpu_instance_id)
            if gi is None or compute_instance_id not in gi.compute_instances:
                raise NotFound(f"no compute instance {gpu_instance_id}/{compute_instance_id}")
            pids = self._busy_pids(g, gpu_instance_id, compute_instance_id)
            if pids:
                raise InUse("processes run on the compute instance", pids)
            self._mutation()
            del gi.compute_instances[compute_instance_id]
            self._keep()

    def destroy_gpu_instance(self, gpu: str, gpu_instance_id: int) -> None:
        """``nvmlGpuInstanceDestroy``: InUse if processes or compute instances remain."""
        with self._lock:
            g = self._gpu(gpu)
            gi = g.instances.get(gpu_instance_id)
            if gi is None:
                raise NotFound(f"no GPU instance {gpu_instance_id}")
            pids = self._busy_pids(g, gpu_instance_id)
            if pids:
                raise InUse("processes run on the GPU instance", pids)
            if gi.compute_instances:
                raise InUse("compute instances exist on the GPU instance")
            self._mutation()
            del g.instances[gpu_instance_id]
            self._keep()
