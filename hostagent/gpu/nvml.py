"""The NVML backend: the only module of the agent that imports ``pynvml`` (nvidia-ml-py).

Initialisation is lazy (``init()``, never at import). Every NVML error is translated at this
boundary, per GPU and per field, the way nvitop/gpustat do it (review D1):

* no library, no driver, a driver/library mismatch (18, after an upgrade without a reboot) or no
  permission at init → :class:`GpuUnavailable`; the agent keeps heartbeating;
* one GPU that will not answer (GPU_IS_LOST, or the Unknown Error 999 of a GPU that fell off
  the bus, INSUFFICIENT_POWER, IRQ_ISSUE) → that GPU is ``lost`` while the others report;
* one field NVML will not give (NOT_SUPPORTED, NO_PERMISSION on a MIG parent as non-root, a
  symbol the driver lacks) → ``None``.

The helpers (:mod:`~hostagent.gpu.nvml_lib`, ``nvml_mig``, ``nvml_telemetry``, ``nvml_events``,
``nvml_probe``) receive the module from here and never import it. Call shapes follow
nvidia-ml-py 13.x (facts file §3).
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any

import pynvml

from hostagent.gpu.backend import (
    BackendError,
    GpuDevice,
    GpuEvent,
    GpuLost,
    GpuSample,
    GpuUnavailable,
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
from hostagent.gpu.nvml_events import XID_MASK, EventRegistry
from hostagent.gpu.nvml_lib import (
    IN_USE,
    INSUFFICIENT_RESOURCES,
    INVALID_ARGUMENT,
    NO_PERMISSION,
    NOT_FOUND,
    NOT_SUPPORTED,
    RESET_REQUIRED,
    SUCCESS,
    UNAVAILABLE,
    Answer,
    Nvml,
    code_name,
)
from hostagent.gpu.nvml_mig import MigReader, ci_preference
from hostagent.gpu.nvml_probe import probe_host
from hostagent.gpu.nvml_telemetry import (
    MIB,
    NO_INSTANCE,
    GiKey,
    GpmTracker,
    TemperatureReader,
    read_processes,
)
from hostagent.protocol import EventKind, GpuStatus

logger = logging.getLogger(__name__)

Runner = Callable[..., "subprocess.CompletedProcess[str]"]
RESET_TIMEOUT_S = 120.0
NVIDIA_SMI = "nvidia-smi"
# On A100/A30 a MIG toggle needs a GPU reset, which every other NVML client blocks
# (gpu-operator#118, NVSentinel#1690, mig-parted#181; review D3).
LIKELY_HOLDERS = (
    "nvidia-persistenced, DCGM/dcgm-exporter, Fabric Manager, nvidia_drm, or this agent"
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pending_message(gpu: str, enabled: bool) -> str:
    action = "enable" if enabled else "disable"
    return (
        f"MIG {action} is pending on {gpu}: it applies at the next GPU reset. The GPU is held "
        f"by another NVML client ({LIKELY_HOLDERS}); stop those, then reset it "
        f"(fleet-agent with --allow-mutation, or `nvidia-smi -r -i {gpu}`) or reboot."
    )


class NvmlBackend:
    """:class:`~hostagent.gpu.backend.GpuBackend` over NVML.

    Args:
        library: the ``pynvml`` module to call (a test double in tests); default the real one.
        run: ``subprocess.run`` or a stand-in, for ``nvidia-smi -r``.
    """

    kind = "nvml"

    def __init__(self, *, library: ModuleType | None = None, run: Runner = subprocess.run) -> None:
        self._nv = Nvml(library if library is not None else pynvml)
        self._run = run
        self._available = False
        self._uuids: dict[int, str] = {}
        self.mig = MigReader(self._nv)
        self.events = EventRegistry(self._nv)
        self._temperature = TemperatureReader(self._nv)
        self._gpm = GpmTracker(self._nv)

    # -- lifecycle -------------------------------------------------------------------------

    def init(self) -> None:
        """``nvmlInit``; any failure (no library, LIB_RM_VERSION_MISMATCH, NO_PERMISSION, …)
        raises :class:`GpuUnavailable`, so the agent runs on and reports ``unavailable``."""
        answer = self._nv.attempt("nvmlInit")
        if not answer.ok:
            raise GpuUnavailable(f"{code_name(answer.code or 0)}: {answer.text}")
        self._available = True

    def shutdown(self) -> None:
        """Free GPM samples and the event set, then ``nvmlShutdown``; safe to call twice."""
        if not self._available:
            return
        self._gpm.release()
        self.events.free()
        self._nv.quiet("nvmlShutdown")
        self._available = False

    def available(self) -> bool:
        """True after a successful ``nvmlInit``."""
        return self._available

    def driver_version(self) -> str | None:
        """``nvmlSystemGetDriverVersion`` (``nvidia-smi --query-gpu=driver_version``)."""
        return self._system_text("nvmlSystemGetDriverVersion")

    def nvml_version(self) -> str | None:
        """``nvmlSystemGetNVMLVersion``."""
        return self._system_text("nvmlSystemGetNVMLVersion")

    def _system_text(self, call: str) -> str | None:
        answer = self._nv.attempt(call) if self._available else Answer(None, 1)
        return _text(answer.value) if answer.ok else None

    # -- discovery -------------------------------------------------------------------------

    def _handle(self, gpu: str) -> Any:
        """``nvmlDeviceGetHandleByUUID``: NotFound for an unknown UUID, GpuLost for a GPU that
        will not answer (GPU_IS_LOST, Unknown Error, INSUFFICIENT_POWER, IRQ_ISSUE, …)."""
        if not self._available:
            raise GpuUnavailable("NVML is not initialised")
        answer = self._nv.attempt("nvmlDeviceGetHandleByUUID", gpu)
        if answer.ok:
            return answer.value
        if answer.code in UNAVAILABLE:
            raise GpuUnavailable(answer.text)
        if answer.code in (NOT_FOUND, INVALID_ARGUMENT):
            raise NotFound(answer.text)
        raise GpuLost(answer.text)

    def _mig_modes(self, handle: Any) -> tuple[bool, bool] | None:
        """``nvmlDeviceGetMigMode`` as ``(current, pending)``; ``None`` if not MIG capable."""
        modes = self._nv.field("nvmlDeviceGetMigMode", handle)
        return (bool(modes[0]), bool(modes[1])) if modes is not None else None

    def list_gpus(self) -> list[GpuDevice]:
        """``nvmlDeviceGetCount`` and per GPU name, UUID, PCI id, memory and MIG mode."""
        if not self._available:
            return []
        count = int(self._nv.call("nvmlDeviceGetCount"))
        return [self._device(i) for i in range(count)]

    def _device(self, index: int) -> GpuDevice:
        handle = self._nv.attempt("nvmlDeviceGetHandleByIndex", index)
        uuid = self._nv.attempt("nvmlDeviceGetUUID", handle.value) if handle.ok else handle
        if not uuid.ok:
            if uuid.code in UNAVAILABLE:
                raise GpuUnavailable(uuid.text)
            logger.warning("GPU %d does not answer: %s", index, uuid.text)
            return self._placeholder(index, "unavailable" if uuid.code == NO_PERMISSION else "lost")
        self._uuids[index] = _text(uuid.value)
        try:
            return self._describe(index, self._uuids[index], handle.value)
        except GpuLost:
            return self._placeholder(index, "lost")

    def _describe(self, index: int, uuid: str, handle: Any) -> GpuDevice:
        name = self._nv.field("nvmlDeviceGetName", handle)
        pci = self._nv.field("nvmlDeviceGetPciInfo", handle)
        # NO_PERMISSION on a MIG parent as non-root (nvml.h L6678): 0, not a crash.
        memory = self._nv.field("nvmlDeviceGetMemoryInfo", handle)
        modes = self._mig_modes(handle)
        return GpuDevice(
            index=index,
            uuid=uuid,
            name=_text(name) if name is not None else "",
            pci_device_id=int(pci.pciDeviceId) if pci is not None else 0,
            memory_total_mib=int(memory.total) // MIB if memory is not None else 0,
            mig_capable=modes is not None,
            mig_mode_current=modes[0] if modes is not None else None,
            mig_mode_pending=modes[1] if modes is not None else None,
        )

    def _placeholder(self, index: int, status: GpuStatus) -> GpuDevice:
        return GpuDevice(
            index=index,
            uuid=self._uuids.get(index, f"GPU-unknown-{index}"),
            name="",
            pci_device_id=0,
            memory_total_mib=0,
            mig_capable=False,
            mig_mode_current=None,
            mig_mode_pending=None,
            status=status,
        )

    def possible_placements(self, gpu: str) -> list[ProfilePlacements]:
        """Profiles via ``nvmlDeviceGetGpuInstanceProfileInfo(V)`` and placements via
        ``nvmlDeviceGetGpuInstancePossiblePlacements_v2`` (``nvidia-smi mig -lgipp``); ``[]``
        while the driver hides them (MIG off on R535), never cached then."""
        handle = self._handle(gpu)
        modes = self._mig_modes(handle)
        if modes is None:
            return []
        return self.mig.possible_placements(gpu, handle, modes[0])

    def mig_instances(self, gpu: str) -> list[MigInstance]:
        """GIs and CIs with placements and ``MIG-…`` UUIDs (``nvidia-smi mig -lgi``/``-lci``)."""
        handle = self._handle(gpu)
        modes = self._mig_modes(handle)
        if modes is None or not modes[0]:
            return []
        sizes = {p.id: p.memory_mib for p in self.mig.gi_profiles(gpu, handle, True)}
        migs = self.mig.mig_devices(handle)
        out: list[MigInstance] = []
        for gi, info in self.mig.gpu_instances(gpu, handle, True):
            base = MigInstance(
                gpu_instance_id=int(info.id),
                profile_id=int(info.profileId),
                start=int(info.placement.start),
                size=int(info.placement.size),
                memory_mib=sizes.get(int(info.profileId)),
            )
            cis = self.mig.compute_instances(gi)
            if not cis:
                out.append(base)
            for ci, _, _ in cis:
                mig = migs.get((base.gpu_instance_id, ci))
                uuid = self._nv.field("nvmlDeviceGetUUID", mig) if mig is not None else None
                out.append(
                    replace(
                        base,
                        compute_instance_id=ci,
                        uuid=_text(uuid) if uuid is not None else None,
                    )
                )
        out.sort(key=lambda m: (m.start, m.compute_instance_id or 0))
        return out

    # -- mutations -------------------------------------------------------------------------

    def set_mig_mode(self, gpu: str, enabled: bool) -> MigModeResult:
        """``nvmlDeviceSetMigMode``, which returns the activation status instead of raising.

        IN_USE with compute processes raises :class:`InUse` with their PIDs. IN_USE without
        any, with the change now pending (A100/A30 held by persistenced, DCGM, this agent…),
        is ``needs_reset`` with a message saying so (review D3).
        """
        handle = self._handle(gpu)
        mode = self._nv.constant(
            "NVML_DEVICE_MIG_ENABLE" if enabled else "NVML_DEVICE_MIG_DISABLE", int(enabled)
        )
        status = int(self._nv.call("nvmlDeviceSetMigMode", handle, mode))
        self._forget(gpu)
        if status == SUCCESS:
            modes = self._mig_modes(handle)
            pending = modes is not None and modes[0] != enabled
            message = _pending_message(gpu, enabled) if pending else ""
            return MigModeResult(ok=True, needs_reset=pending, message=message)
        if status == RESET_REQUIRED:
            return MigModeResult(ok=True, needs_reset=True, message=_pending_message(gpu, enabled))
        if status == IN_USE:
            return self._toggle_in_use(gpu, handle, enabled)
        raise BackendError(f"nvmlDeviceSetMigMode activation status {code_name(status)}")

    def _toggle_in_use(self, gpu: str, handle: Any, enabled: bool) -> MigModeResult:
        pids = self._pids(gpu, None)
        if pids:
            raise InUse("processes run on the GPU", pids)
        modes = self._mig_modes(handle)
        if modes is not None and modes[1] == enabled:
            return MigModeResult(ok=True, needs_reset=True, message=_pending_message(gpu, enabled))
        raise InUse(f"MIG mode of {gpu} cannot change: the GPU is in use ({LIKELY_HOLDERS})")

    def reset_gpu(self, gpu: str) -> None:
        """``nvidia-smi -r -i <uuid>``, with this process's NVML session closed meanwhile.

        An open NVML session holds every GPU and makes the reset fail, so the event set and
        GPM samples are freed and NVML shut down first (mig-parted does the same), then
        initialised again and every discovery cache dropped. Calls from other threads meanwhile
        get :class:`GpuUnavailable`. Raises :class:`InUse` (with the PIDs) while processes run
        or when nvidia-smi says another client holds the GPU, :class:`BackendError` otherwise.
        """
        try:
            pids = self._pids(gpu, None, strict=True)
        except GpuLost:
            pids = ()  # a GPU that fell off the bus is what a reset is for
        if pids:
            raise InUse("processes run on the GPU", pids)
        self.shutdown()
        try:
            done = self._run(
                [NVIDIA_SMI, "-r", "-i", gpu],
                capture_output=True,
                text=True,
                timeout=RESET_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self._reinit()
            raise BackendError(f"nvidia-smi -r -i {gpu}: {exc}") from exc
        self._reinit()
        output = f"{done.stdout or ''}{done.stderr or ''}".strip()
        if done.returncode != 0:
            if "in use" in output.lower():
                raise InUse(f"reset refused: {output}")
            raise BackendError(f"nvidia-smi -r -i {gpu} exited {done.returncode}: {output}")

    def _reinit(self) -> None:
        self._forget(None)
        self.init()

    def _forget(self, gpu: str | None) -> None:
        self.mig.forget(gpu)
        if gpu is None:
            self._gpm.release()

    def set_compute_mode(self, gpu: str, exclusive_process: bool) -> None:
        """``nvmlDeviceSetComputeMode``: ``EXCLUSIVE_PROCESS`` for whole-GPU MPS (NVIDIA's MPS
        guide; the k8s device plugin does the same), ``DEFAULT`` otherwise (review D19). Not
        supported in MIG mode (facts §2)."""
        handle = self._handle(gpu)
        modes = self._mig_modes(handle)
        if modes is not None and modes[0]:
            raise NotSupported(f"{gpu} is in MIG mode: compute mode cannot be set")
        name = (
            "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS"
            if exclusive_process
            else "NVML_COMPUTEMODE_DEFAULT"
        )
        self._nv.call(
            "nvmlDeviceSetComputeMode", handle, self._nv.constant(name, 3 * exclusive_process)
        )

    def _profile(self, gpu: str, profile_id: int) -> ProfilePlacements:
        for p in self.possible_placements(gpu):
            if p.profile_id == profile_id:
                return p
        raise InvalidPlacement(f"profile {profile_id} is not supported on {gpu}")

    def create_gpu_instance(self, gpu: str, profile_id: int, start: int) -> MigInstance:
        """``nvmlDeviceCreateGpuInstanceWithPlacement`` (``nvidia-smi mig -cgi ID:START``)."""
        handle = self._handle(gpu)
        profile = self._profile(gpu, profile_id)
        placement = self._nv.module.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = profile.memory_slices
        gi = self._nv.call(
            "nvmlDeviceCreateGpuInstanceWithPlacement", handle, profile_id, ctypes.byref(placement)
        )
        info = self._nv.call("nvmlGpuInstanceGetInfo", gi)
        return MigInstance(
            gpu_instance_id=int(info.id),
            profile_id=profile_id,
            start=int(info.placement.start),
            size=int(info.placement.size),
            memory_mib=profile.memory_mib,
        )

    def create_compute_instance(self, gpu: str, gpu_instance_id: int) -> MigInstance:
        """A full-size compute instance, the profile with the most SMs first
        (``nvmlGpuInstanceCreateComputeInstance``, ``nvidia-smi mig -cci -gi ID``; review D8).

        Only full-size profiles are candidates; the next is tried when one answers
        INSUFFICIENT_RESOURCES or NOT_SUPPORTED (go-nvlib's REV1 choice failed on A100).
        """
        handle = self._handle(gpu)
        gi = self._nv.call("nvmlDeviceGetGpuInstanceById", handle, gpu_instance_id)
        profiles = self.mig.ci_profiles(gi)
        if not profiles:
            raise NotSupported(f"no compute-instance profile on GI {gpu_instance_id}")
        full = max(p.slices for p in profiles)
        answer = Answer(None, NOT_SUPPORTED)
        for profile in sorted((p for p in profiles if p.slices == full), key=ci_preference):
            answer = self._nv.attempt("nvmlGpuInstanceCreateComputeInstance", gi, profile.id)
            if answer.ok or answer.code not in (INSUFFICIENT_RESOURCES, NOT_SUPPORTED):
                break
        if not answer.ok:
            raise answer.error()
        ci_id = int(self._nv.call("nvmlComputeInstanceGetInfo", answer.value).id)
        for inst in self.mig_instances(gpu):
            if inst.gpu_instance_id == gpu_instance_id and inst.compute_instance_id == ci_id:
                return inst
        raise NotFound(f"compute instance {gpu_instance_id}/{ci_id} vanished")

    def destroy_compute_instance(
        self, gpu: str, gpu_instance_id: int, compute_instance_id: int
    ) -> None:
        """``nvmlComputeInstanceDestroy``; IN_USE → :class:`InUse` with the PIDs found."""
        handle = self._handle(gpu)
        gi = self._nv.call("nvmlDeviceGetGpuInstanceById", handle, gpu_instance_id)
        ci = self._nv.call("nvmlGpuInstanceGetComputeInstanceById", gi, compute_instance_id)
        self._destroy(gpu, gpu_instance_id, "nvmlComputeInstanceDestroy", ci)

    def destroy_gpu_instance(self, gpu: str, gpu_instance_id: int) -> None:
        """``nvmlGpuInstanceDestroy``; IN_USE → :class:`InUse` with the PIDs found."""
        handle = self._handle(gpu)
        gi = self._nv.call("nvmlDeviceGetGpuInstanceById", handle, gpu_instance_id)
        self._destroy(gpu, gpu_instance_id, "nvmlGpuInstanceDestroy", gi)

    def _destroy(self, gpu: str, gpu_instance_id: int, call: str, target: Any) -> None:
        answer = self._nv.attempt(call, target)
        if answer.code == IN_USE:
            raise InUse(answer.text, self._pids(gpu, gpu_instance_id))
        if not answer.ok:
            raise answer.error()

    def _pids(
        self, gpu: str, gpu_instance_id: int | None, *, strict: bool = False
    ) -> tuple[int, ...]:
        try:
            procs = self.processes(gpu)
        except BackendError:
            if strict:
                raise
            return ()
        return tuple(
            sorted(
                p.pid
                for p in procs
                if gpu_instance_id is None or p.gpu_instance_id == gpu_instance_id
            )
        )

    # -- telemetry -------------------------------------------------------------------------

    def processes(self, gpu: str) -> list[ProcessSample]:
        """``nvmlDeviceGetComputeRunningProcesses`` and
        ``nvmlDeviceGetMPSComputeRunningProcesses``: workloads, the MPS server and MPS clients,
        told apart by ``kind`` (review D5)."""
        return read_processes(self._nv, self._handle(gpu))

    def _ecc(self, handle: Any, error_type: str, default: int) -> int | None:
        value = self._nv.field(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            self._nv.constant(error_type, default),
            self._nv.constant("NVML_VOLATILE_ECC", 0),
        )
        return int(value) if value is not None else None

    def sample(self, gpu: str) -> GpuSample:
        """Utilisation (``None`` on MIG-enabled GPUs, per nvml.h), memory, temperature, power,
        volatile ECC totals, processes and per-MIG memory/GPM utilisation. A GPU that will not
        answer gives ``status="lost"``; a field NVML will not give is ``None``."""
        try:
            return self._sample(gpu)
        except (GpuLost, NotFound):
            return GpuSample(uuid=gpu, status="lost")

    def _sample(self, gpu: str) -> GpuSample:
        handle = self._handle(gpu)
        modes = self._mig_modes(handle)
        mig = bool(modes and modes[0])
        util = None if mig else self._nv.field("nvmlDeviceGetUtilizationRates", handle)
        memory = self._nv.field("nvmlDeviceGetMemoryInfo", handle)
        power = self._nv.field("nvmlDeviceGetPowerUsage", handle)
        return GpuSample(
            uuid=gpu,
            status="ok",
            utilization_gpu_percent=float(util.gpu) if util is not None else None,
            memory_used_mib=int(memory.used) // MIB if memory is not None else None,
            memory_total_mib=int(memory.total) // MIB if memory is not None else None,
            temperature_c=self._temperature.read(gpu, handle),
            power_mw=int(power) if power is not None else None,
            ecc_corrected=self._ecc(handle, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0),
            ecc_uncorrected=self._ecc(handle, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            processes=tuple(self._field_processes(handle)),
            mig=tuple(self._mig_samples(gpu, handle)) if mig else self._no_mig(gpu),
        )

    def _field_processes(self, handle: Any) -> list[ProcessSample]:
        try:
            return read_processes(self._nv, handle)
        except (GpuLost, GpuUnavailable):
            raise
        except BackendError as exc:
            logger.debug("process list unreadable: %s", exc)
            return []

    def _no_mig(self, gpu: str) -> tuple[MigSample, ...]:
        self._gpm.release(gpu)  # GIs are gone with MIG mode; so are their baselines
        return ()

    def _mig_samples(self, gpu: str, handle: Any) -> list[MigSample]:
        migs = self.mig.mig_devices(handle)
        util: dict[int, float | None] = {}
        if self._gpm.supported(gpu, handle):
            keys = {gi: self._gi_key(handle, gi) for gi, _ in migs}
            util = self._gpm.utilisation(gpu, handle, keys)
        out = []
        for (gi, ci), mig in sorted(migs.items()):
            memory = self._nv.field("nvmlDeviceGetMemoryInfo", mig)
            uuid = self._nv.field("nvmlDeviceGetUUID", mig)
            out.append(
                MigSample(
                    gpu_instance_id=gi,
                    compute_instance_id=ci,
                    uuid=_text(uuid) if uuid is not None else None,
                    utilization_percent=util.get(gi),
                    memory_used_mib=int(memory.used) // MIB if memory is not None else None,
                    memory_total_mib=int(memory.total) // MIB if memory is not None else None,
                )
            )
        return out

    def _gi_key(self, handle: Any, gi: int) -> GiKey:
        """(GI id, profile, start): a GI destroyed and made again elsewhere is a new baseline."""
        gi_handle = self._nv.attempt("nvmlDeviceGetGpuInstanceById", handle, gi)
        info = self._nv.attempt("nvmlGpuInstanceGetInfo", gi_handle.value) if gi_handle.ok else None
        if info is None or not info.ok:
            return (gi, None, None)
        return (gi, int(info.value.profileId), int(info.value.placement.start))

    # -- events ----------------------------------------------------------------------------

    def _answering(self) -> list[tuple[str, Any]]:
        """``(uuid, handle)`` of the GPUs answering now; the others are to register again."""
        count = self._nv.attempt("nvmlDeviceGetCount")
        out = []
        for index in range(int(count.value) if count.ok else 0):
            handle = self._nv.attempt("nvmlDeviceGetHandleByIndex", index)
            uuid = self._nv.attempt("nvmlDeviceGetUUID", handle.value) if handle.ok else handle
            if uuid.ok:
                out.append((_text(uuid.value), handle.value))
            elif index in self._uuids:
                self.events.forget(self._uuids[index])
        return out

    def wait_events(self, timeout_ms: int) -> list[GpuEvent]:
        """``nvmlEventSetWait``; ``NVMLError_Timeout`` means no event. Drains what is queued.

        Each GPU is registered on its own and again after it was lost or reset (review D7).
        """
        if not self._available:
            return []
        if self.events.ensure(self._answering()) is None:
            time.sleep(timeout_ms / 1000)  # keep the caller's pacing without an event set
            return []
        return [self._event(data) for data in self.events.wait(timeout_ms)]

    def _event(self, data: Any) -> GpuEvent:
        uuid = self._nv.attempt("nvmlDeviceGetUUID", data.device)
        gi = int(data.gpuInstanceId)
        kind: EventKind = "xid" if int(data.eventType) & XID_MASK else "ecc"
        xid = int(data.eventData) if kind == "xid" else None
        detail = f"Xid {xid}" if kind == "xid" else f"ECC event 0x{int(data.eventType):x}"
        return GpuEvent(
            kind=kind,
            gpu_uuid=_text(uuid.value) if uuid.ok else "GPU-unknown",
            detail=detail,
            ts=time.time(),
            gpu_instance_id=None if gi == NO_INSTANCE else gi,
            xid=xid,
        )

    # -- probe -----------------------------------------------------------------------------

    def probe(self) -> dict[str, Any]:
        """A read-only record of the host (``fleet-agent --probe --json``); see
        :func:`hostagent.gpu.nvml_probe.probe_host`. Changes nothing."""
        return probe_host(self._nv, self.mig, available=self._available)
