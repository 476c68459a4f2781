"""A fake ``pynvml`` module with nvidia-ml-py's call shapes, over :class:`FakeHardware`.

Constants, error classes and ctypes structs come from the real ``pynvml`` (importing it needs no
GPU); the ``nvml*`` functions are replaced. Handles that NVML hands back in caller-allocated
arrays (GPU/compute instances) are integers in ``c_void_p`` arrays here. Which calls exist, and
how they answer, follows the hardware's driver profile (see :mod:`tests.hostagent.fake_gpu`)::

    hw = FakeHardware("r535")                   # or install("r535") for hardware + module
    backend = NvmlBackend(library=make_fake(hw), run=hw.nvidia_smi)
"""

from __future__ import annotations

import ctypes
import functools
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml as real

from tests.hostagent.fake_gpu import (
    FUNCTION_NOT_FOUND,
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    NO_ID,
    NO_PERMISSION,
    NOT_FOUND,
    NOT_SUPPORTED,
    TIMEOUT,
    UNKNOWN,
    EventSet,
    FakeGpu,
    FakeHardware,
    NvmlFailure,
    real_error,
)

MIB = 1024 * 1024
__all__ = ["Device", "FakeHardware", "MigDevice", "install", "make_fake"]


@dataclass(frozen=True)
class Device:
    uuid: str


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    parent: str
    gi: int
    ci: int


class Obj(types.SimpleNamespace):
    pass


class GpmMetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [Obj(metricId=0, nvmlReturn=0, value=0.0) for _ in range(4)]


def install(profile: str = "r570", gpus: list[Any] | None = None, *, root: bool = True):
    """Hardware under a driver profile and the fake module over it: ``(hw, module)``."""
    hw = FakeHardware(profile, gpus, root=root)
    return hw, make_fake(hw)


def _target(hw: FakeHardware, call: str, args: tuple[Any, ...]) -> str | None:
    """The UUID an injected failure is matched against: the device's, MIG device's, the
    parent GPU's for GI/CI handles, the indexed GPU's for ``nvmlDeviceGetHandleByIndex``."""
    first = args[0] if args else None
    if isinstance(first, Device | MigDevice):
        return first.uuid
    if call == "nvmlDeviceGetHandleByIndex" and isinstance(first, int) and first < len(hw.gpus):
        return hw.gpus[first].uuid
    instance_call = call.startswith(("nvmlGpuInstance", "nvmlComputeInstance"))
    if instance_call and isinstance(first, int) and first in hw.handles:
        return str(hw.handles[first][1])
    return None


def make_fake(hw: FakeHardware, *, library_present: bool = True) -> types.ModuleType:
    mod = types.ModuleType("pynvml")
    for name in dir(real):
        if not name.startswith("nvml") and not name.startswith("__"):
            setattr(mod, name, getattr(real, name))
    mod.c_nvmlGpuInstance_t = ctypes.c_void_p
    mod.c_nvmlComputeInstance_t = ctypes.c_void_p
    mod.c_nvmlGpmMetricsGet_t = GpmMetricsGet
    hw.library_present = library_present
    driver = hw.driver
    missing: set[str] = set()
    if not driver.temperature_v:
        missing.add("nvmlDeviceGetTemperatureV")  # C symbol first in NVML 12.8 (review D6)
    if not driver.gpm:
        missing |= {"nvmlGpmQueryDeviceSupport", "nvmlGpmMigSampleGet", "nvmlGpmSampleAlloc"}
    if not driver.processes_v3:
        missing |= {"nvmlDeviceGetComputeRunningProcesses_v3"}
        missing |= {"nvmlDeviceGetMPSComputeRunningProcesses_v3"}

    def nvml(fn: Callable[..., Any]) -> Callable[..., Any]:
        name = fn.__name__

        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if not hw.initialised:
                raise real.NVMLError(1)
            try:
                if name in missing:
                    raise NvmlFailure(FUNCTION_NOT_FOUND, name)
                hw.check(name, _target(hw, name, args), args[1] if len(args) > 1 else None)
                return fn(*args, **kwargs)
            except NvmlFailure as exc:
                if name == "nvmlDeviceRegisterEvents" and exc.code == UNKNOWN:
                    args[2].broken = True  # nvml.h L9897: "event set is in undefined state"
                raise real_error(exc) from None

        setattr(mod, name, inner)
        return inner

    def gpu(h: Device) -> FakeGpu:
        return hw.gpu(h.uuid)

    # -- library ---------------------------------------------------------------------------

    def nvmlInit() -> None:
        if not hw.library_present:
            raise real.NVMLError(12)
        try:
            hw.check("nvmlInit", None)
        except NvmlFailure as exc:
            raise real_error(exc) from None
        hw.initialised = True

    mod.nvmlInit = nvmlInit

    @nvml
    def nvmlShutdown() -> None:
        hw.initialised = False

    @nvml
    def nvmlSystemGetDriverVersion() -> str:
        return driver.driver_version

    @nvml
    def nvmlSystemGetNVMLVersion() -> str:
        return driver.nvml_version

    @nvml
    def nvmlSystemGetCudaDriverVersion_v2() -> int:
        return driver.cuda_driver_version

    @nvml
    def nvmlSystemGetProcessName(pid: int) -> str:
        for g in hw.gpus:
            if pid in g.procs:
                return "/usr/bin/" + g.procs[pid].name
        raise NvmlFailure(NOT_FOUND, f"pid {pid}")

    # -- devices ---------------------------------------------------------------------------

    @nvml
    def nvmlDeviceGetCount() -> int:
        return len(hw.gpus)

    @nvml
    def nvmlDeviceGetHandleByIndex(i: int) -> Device:
        g = hw.gpus[i]
        if g.lost_code is not None:
            raise NvmlFailure(g.lost_code, "Unable to determine the device handle")
        return Device(g.uuid)

    @nvml
    def nvmlDeviceGetHandleByUUID(uuid: str) -> Device:
        return Device(hw.gpu(uuid).uuid)

    @nvml
    def nvmlDeviceGetUUID(h: Device | MigDevice) -> str:
        return h.uuid if isinstance(h, MigDevice) else gpu(h).uuid

    @nvml
    def nvmlDeviceGetName(h: Device) -> str:
        return gpu(h).name

    @nvml
    def nvmlDeviceGetPciInfo(h: Device) -> Obj:
        g = gpu(h)
        return Obj(pciDeviceId=g.pci_device_id, busId=g.bus_id.encode())

    @nvml
    def nvmlDeviceGetMemoryInfo(h: Device | MigDevice) -> Obj:
        if isinstance(h, MigDevice):
            g = hw.gpu(h.parent)
            gi = g.gis[h.gi]
            used = sum(p.memory_mib or 0 for p in g.procs.values() if p.gi == h.gi)
            total = gi.profile.memory_mib
        else:
            g = gpu(h)
            if g.mig_current and not hw.root:
                # nvml.h L6678: aggregate on a MIG parent "only if the caller has appropriate
                # privileges".
                raise NvmlFailure(NO_PERMISSION, "MIG parent memory as non-root")
            used = sum(p.memory_mib or 0 for p in g.procs.values())
            total = g.memory_mib
        return Obj(total=total * MIB, used=used * MIB, free=(total - used) * MIB)

    @nvml
    def nvmlDeviceGetMigMode(h: Device) -> list[int]:
        g = gpu(h)
        if not g.mig_capable:
            raise NvmlFailure(NOT_SUPPORTED, "not MIG capable")
        return [int(g.mig_current), int(g.mig_pending)]

    @nvml
    def nvmlDeviceSetMigMode(h: Device, mode: int) -> int:
        return hw.set_mig_mode(gpu(h), bool(mode))

    @nvml
    def nvmlDeviceGetComputeMode(h: Device) -> int:
        return gpu(h).compute_mode

    @nvml
    def nvmlDeviceSetComputeMode(h: Device, mode: int) -> None:
        hw.set_compute_mode(gpu(h), mode)

    # -- MIG discovery ---------------------------------------------------------------------

    @nvml
    def nvmlDeviceGetGpuInstanceProfileInfo(h: Device, const: int, version: int = 2) -> Obj:
        if version == 2 and not driver.profile_info_v:
            raise NvmlFailure(FUNCTION_NOT_FOUND, "nvmlDeviceGetGpuInstanceProfileInfoV")
        g = gpu(h)
        known = driver.profile_constants
        if const >= real.NVML_GPU_INSTANCE_PROFILE_COUNT or (known is not None and const >= known):
            raise NvmlFailure(INVALID_ARGUMENT, "bad constant")
        if not g.mig_capable or (driver.profiles_need_mig and not g.mig_current):
            # nvml.h L12855: NOT_SUPPORTED "If device doesn't have MIG mode enabled" (R535).
            raise NvmlFailure(NOT_SUPPORTED, "MIG mode is off")
        p = next((p for p in g.profiles if p.constant == const), None)
        if p is None:
            raise NvmlFailure(NOT_SUPPORTED, "profile not supported")
        info = Obj(
            id=p.id,
            isP2pSupported=0,
            sliceCount=p.slices,
            instanceCount=p.instance_count,
            multiprocessorCount=p.sms,
            copyEngineCount=p.slices,
            decoderCount=0,
            encoderCount=0,
            jpegCount=0,
            ofaCount=0,
            memorySizeMB=p.memory_mib,
        )
        if version == 2:
            info.version, info.name = real.nvmlGpuInstanceProfileInfo_v2, p.name.encode()
        return info

    @nvml
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        h: Device, pid: int, array: Any, count_ref: Any
    ) -> int:
        g = gpu(h)
        hw._privileged()
        p = next((p for p in g.profiles if p.id == pid), None)
        if p is None:
            raise NvmlFailure(NOT_SUPPORTED, f"profile {pid}")
        if array is not None:
            if count_ref._obj.value < len(p.placements):
                raise NvmlFailure(INSUFFICIENT_SIZE, "placements")
            for i, (start, size) in enumerate(p.placements):
                array[i].start, array[i].size = start, size
        count_ref._obj.value = len(p.placements)
        return 0

    @nvml
    def nvmlDeviceGetGpuInstances(h: Device, pid: int, array: Any, count_ref: Any) -> int:
        g = gpu(h)
        hw._privileged()
        if not g.mig_current:
            raise NvmlFailure(NOT_SUPPORTED, "MIG mode is off")
        found = [gi for _, gi in sorted(g.gis.items()) if gi.profile.id == pid]
        if count_ref._obj.value < len(found):
            raise NvmlFailure(INSUFFICIENT_SIZE, "GPU instances")
        for i, gi in enumerate(found):
            array[i] = hw.handle("gi", g.uuid, gi.id)
        count_ref._obj.value = len(found)
        return 0

    @nvml
    def nvmlDeviceGetGpuInstanceById(h: Device, gi_id: int) -> int:
        g = gpu(h)
        if gi_id not in g.gis:
            raise NvmlFailure(NOT_FOUND, f"GI {gi_id}")
        return hw.handle("gi", g.uuid, gi_id)

    @nvml
    def nvmlGpuInstanceGetInfo(gh: int) -> Obj:
        _, gi = hw.gi(gh)
        placement = Obj(start=gi.start, size=gi.profile.memory_slices)
        return Obj(id=gi.id, profileId=gi.profile.id, placement=placement)

    @nvml
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gh: int, const: int, eng: int, version: int = 2
    ) -> Obj:
        if version == 2 and not driver.profile_info_v:
            raise NvmlFailure(FUNCTION_NOT_FOUND, "nvmlGpuInstanceGetComputeInstanceProfileInfoV")
        g, gi = hw.gi(gh)
        if const >= real.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise NvmlFailure(INVALID_ARGUMENT, "bad constant")
        p = next((p for p in hw.ci_profiles(g, gi.profile) if p.constant == const), None)
        if p is None:
            raise NvmlFailure(NOT_SUPPORTED, "CI profile not supported")
        info = Obj(
            id=p.id,
            sliceCount=p.slices,
            instanceCount=p.instance_count,
            multiprocessorCount=p.sms,
            sharedCopyEngineCount=p.slices,
            sharedDecoderCount=0,
            sharedEncoderCount=0,
            sharedJpegCount=0,
            sharedOfaCount=0,
        )
        if version == 2:
            info.version, info.name = real.nvmlComputeInstanceProfileInfo_v2, p.name.encode()
        return info

    @nvml
    def nvmlGpuInstanceGetComputeInstances(gh: int, pid: int, array: Any, count_ref: Any) -> int:
        g, gi = hw.gi(gh)
        found = [ci for _, ci in sorted(gi.cis.items()) if ci.profile.id == pid]
        if count_ref._obj.value < len(found):
            raise NvmlFailure(INSUFFICIENT_SIZE, "compute instances")
        for i, ci in enumerate(found):
            array[i] = hw.handle("ci", g.uuid, gi.id, ci.id)
        count_ref._obj.value = len(found)
        return 0

    @nvml
    def nvmlComputeInstanceGetInfo(ch: int) -> Obj:
        _, _, ci = hw.ci(ch)
        placement = Obj(start=ci.start, size=ci.profile.slices)
        return Obj(id=ci.id, profileId=ci.profile.id, placement=placement)

    @nvml
    def nvmlGpuInstanceGetComputeInstanceById(gh: int, ci_id: int) -> int:
        g, gi = hw.gi(gh)
        if ci_id not in gi.cis:
            raise NvmlFailure(NOT_FOUND, f"CI {ci_id}")
        return hw.handle("ci", g.uuid, gi.id, ci_id)

    @nvml
    def nvmlDeviceGetMaxMigDeviceCount(h: Device) -> int:
        g = gpu(h)
        if not g.mig_capable:
            raise NvmlFailure(NOT_SUPPORTED, "not MIG capable")
        return g.compute_slices

    @nvml
    def nvmlDeviceGetMigDeviceHandleByIndex(h: Device, i: int) -> MigDevice:
        g = gpu(h)
        found = hw.mig_devices(g) if g.mig_current else []
        if i >= len(found):
            raise NvmlFailure(NOT_FOUND, f"MIG device {i}")
        gi, ci = found[i]
        return MigDevice(ci.uuid, g.uuid, gi.id, ci.id)

    @nvml
    def nvmlDeviceGetGpuInstanceId(m: MigDevice) -> int:
        return m.gi

    @nvml
    def nvmlDeviceGetComputeInstanceId(m: MigDevice) -> int:
        return m.ci

    # -- MIG mutations ---------------------------------------------------------------------

    @nvml
    def nvmlDeviceCreateGpuInstanceWithPlacement(h: Device, pid: int, placement_ref: Any) -> int:
        g = gpu(h)
        gi = hw.create_gi(g, pid, placement_ref._obj.start)
        return hw.handle("gi", g.uuid, gi.id)

    @nvml
    def nvmlGpuInstanceCreateComputeInstance(gh: int, pid: int) -> int:
        g, gi = hw.gi(gh)
        ci = hw.create_ci(g, gi, pid)
        return hw.handle("ci", g.uuid, gi.id, ci.id)

    @nvml
    def nvmlComputeInstanceDestroy(ch: int) -> None:
        hw.destroy_ci(*hw.ci(ch))

    @nvml
    def nvmlGpuInstanceDestroy(gh: int) -> None:
        hw.destroy_gi(*hw.gi(gh))

    # -- processes and telemetry -----------------------------------------------------------

    def proc_list(h: Device | MigDevice, mps: bool) -> list[Obj]:
        g = hw.gpu(h.parent) if isinstance(h, MigDevice) else gpu(h)
        return [
            Obj(
                pid=p.pid,
                usedGpuMemory=None if p.memory_mib is None else p.memory_mib * MIB,
                gpuInstanceId=NO_ID if p.gi is None else p.gi,
                computeInstanceId=NO_ID if p.ci is None else p.ci,
            )
            for p in sorted(g.procs.values(), key=lambda p: p.pid)
            if (p.mps if mps else p.listed_compute)
        ]

    @nvml
    def nvmlDeviceGetComputeRunningProcesses_v3(h: Device) -> list[Obj]:
        return proc_list(h, mps=False)

    @nvml
    def nvmlDeviceGetComputeRunningProcesses_v2(h: Device) -> list[Obj]:
        return proc_list(h, mps=False)

    @nvml
    def nvmlDeviceGetMPSComputeRunningProcesses_v3(h: Device) -> list[Obj]:
        return proc_list(h, mps=True)

    @nvml
    def nvmlDeviceGetMPSComputeRunningProcesses_v2(h: Device) -> list[Obj]:
        return proc_list(h, mps=True)

    def unversioned(versioned: Callable[..., Any]) -> Callable[..., Any]:
        # The binding's @throwOnVersionMismatch turns FUNCTION_NOT_FOUND of the _v3 symbol
        # into NVMLLibraryMismatchError, which is not an NVMLError (review §1).
        def call(h: Any) -> Any:
            try:
                return versioned(h)
            except real.NVMLError_FunctionNotFound:
                raise real.NVMLLibraryMismatchError("use a versioned function") from None

        return call

    mod.nvmlDeviceGetComputeRunningProcesses = unversioned(nvmlDeviceGetComputeRunningProcesses_v3)
    mod.nvmlDeviceGetMPSComputeRunningProcesses = unversioned(
        nvmlDeviceGetMPSComputeRunningProcesses_v3
    )

    @nvml
    def nvmlDeviceGetUtilizationRates(h: Device) -> Obj:
        g = gpu(h)
        if g.mig_current:
            raise NvmlFailure(NOT_SUPPORTED, "MIG enabled")  # nvml.h L7075
        return Obj(gpu=hw.gpu_util(g), memory=0)

    @nvml
    def nvmlDeviceGetTemperatureV(h: Device, sensor: int) -> int:
        gpu(h)
        return 35

    @nvml
    def nvmlDeviceGetTemperature(h: Device, sensor: int) -> int:
        gpu(h)
        return 34

    @nvml
    def nvmlDeviceGetPowerUsage(h: Device) -> int:
        gpu(h)
        return 70_000

    @nvml
    def nvmlDeviceGetTotalEccErrors(h: Device, error_type: int, counter: int) -> int:
        return gpu(h).ecc[error_type]

    # -- GPM -------------------------------------------------------------------------------

    @nvml
    def nvmlGpmQueryDeviceSupport(h: Device) -> Obj:
        return Obj(version=1, isSupportedDevice=int(gpu(h).family == "hopper"))

    @nvml
    def nvmlGpmSampleAlloc() -> Any:
        return hw.gpm_alloc()

    @nvml
    def nvmlGpmMigSampleGet(h: Device, gi_id: int, sample: Any) -> Any:
        g = gpu(h)
        if gi_id not in g.gis:
            raise NvmlFailure(NOT_FOUND, f"GI {gi_id}")
        sample.util, sample.serial = hw.gi_util(g, gi_id), g.gis[gi_id].serial
        return sample

    @nvml
    def nvmlGpmSampleFree(sample: Any) -> None:
        hw.gpm_live.pop(sample.id, None)

    @nvml
    def nvmlGpmMetricsGet(mg: GpmMetricsGet) -> GpmMetricsGet:
        # Samples of two GI generations give a meaningless number, as on hardware (D12).
        same = mg.sample1.serial == mg.sample2.serial
        mg.metrics[0].value = mg.sample2.util if same else 987.6
        mg.metrics[0].nvmlReturn = 0
        return mg

    # -- events ----------------------------------------------------------------------------

    @nvml
    def nvmlEventSetCreate() -> EventSet:
        es = EventSet()
        hw.event_sets.append(es)
        return es

    @nvml
    def nvmlEventSetFree(es: EventSet) -> None:
        es.freed = True

    @nvml
    def nvmlDeviceGetSupportedEventTypes(h: Device) -> int:
        return gpu(h).supported_events

    @nvml
    def nvmlDeviceRegisterEvents(h: Device | MigDevice, mask: int, es: EventSet) -> None:
        if isinstance(h, MigDevice):
            raise NvmlFailure(NOT_SUPPORTED, "per-instance registration")  # facts §3.5
        es.registered[gpu(h).uuid] = mask

    @nvml
    def nvmlEventSetWait(es: EventSet, timeout_ms: int) -> Obj:
        if es.freed:
            raise NvmlFailure(INVALID_ARGUMENT, "freed event set")
        if es.broken:
            raise NvmlFailure(UNKNOWN, "event set in undefined state")
        if not es.queue:
            raise NvmlFailure(TIMEOUT, "no event")
        uuid, kind, data, gi = es.queue.pop(0)
        return Obj(
            device=Device(uuid),
            eventType=kind,
            eventData=data,
            gpuInstanceId=gi,
            computeInstanceId=NO_ID,
        )

    return mod
