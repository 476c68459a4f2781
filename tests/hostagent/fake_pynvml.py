"""A fake ``pynvml`` module with nvidia-ml-py's call shapes, backed by a SimulatedBackend.

Constants, error classes and ctypes structs come from the real ``pynvml`` (importing it needs no
GPU); the ``nvml*`` functions are replaced. Handles that NVML hands back in caller-allocated
arrays (GPU/compute instances) are integers in ``c_void_p`` arrays here.
"""

from __future__ import annotations

import ctypes
import types
from dataclasses import dataclass
from typing import Any

import pynvml as real

from hostagent.gpu import backend as b
from hostagent.gpu.simulated import SimulatedBackend, is_ampere

MIB = 1024 * 1024
NO_ID = 0xFFFFFFFF

_CODES: list[tuple[type[Exception], int]] = [
    (b.InUse, 19),
    (b.InsufficientResources, 23),
    (b.InvalidPlacement, 2),
    (b.GpuLost, 15),
    (b.NotFound, 6),
    (b.NotSupported, 3),
    (b.GpuUnavailable, 12),
    (b.BackendError, 999),
]


def _nvml_error(exc: Exception) -> Exception:
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return real.NVMLError(code)
    return exc


@dataclass(frozen=True)
class Device:
    uuid: str


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    gi: int
    ci: int
    mig_uuid: str


class Obj(types.SimpleNamespace):
    pass


class GpmMetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [Obj(metricId=0, nvmlReturn=0, value=0.0) for _ in range(4)]


def make_fake(sim: SimulatedBackend, *, library_present: bool = True) -> types.ModuleType:
    mod = types.ModuleType("pynvml")
    for name in dir(real):
        if not name.startswith("nvml") and not name.startswith("__"):
            setattr(mod, name, getattr(real, name))
    mod.c_nvmlGpuInstance_t = ctypes.c_void_p
    mod.c_nvmlComputeInstance_t = ctypes.c_void_p
    mod.c_nvmlGpmMetricsGet_t = GpmMetricsGet
    handles: dict[int, tuple[Any, ...]] = {}
    state: dict[str, Any] = {"init": False, "events": []}

    def wrap(fn):
        def inner(*args, **kwargs):
            if not state["init"]:
                raise real.NVMLError(1)
            try:
                return fn(*args, **kwargs)
            except b.BackendError as exc:
                raise _nvml_error(exc) from exc

        inner.__name__ = fn.__name__
        setattr(mod, fn.__name__, inner)
        return inner

    def handle(*key: Any) -> int:
        for h, k in handles.items():
            if k == key:
                return h
        h = len(handles) + 1
        handles[h] = key
        return h

    def gpus():
        return sim.list_gpus()

    def dev(h: Device):
        return next(d for d in gpus() if d.uuid == h.uuid)

    def check_lost(h: Any) -> None:
        uuid = h.uuid
        if dev(Device(uuid)).status == "lost":
            raise b.GpuLost("lost")

    def nvmlInit():
        if not library_present:
            raise real.NVMLError(12)
        state["init"] = True

    mod.nvmlInit = nvmlInit

    @wrap
    def nvmlShutdown():
        state["init"] = False

    @wrap
    def nvmlSystemGetDriverVersion():
        return sim.driver_version()

    @wrap
    def nvmlSystemGetNVMLVersion():
        return sim.nvml_version()

    @wrap
    def nvmlDeviceGetCount():
        return len(gpus())

    @wrap
    def nvmlDeviceGetHandleByIndex(i):
        return Device(gpus()[i].uuid)

    @wrap
    def nvmlDeviceGetHandleByUUID(uuid):
        if all(d.uuid != uuid for d in gpus()):
            raise b.NotFound(uuid)
        return Device(uuid)

    @wrap
    def nvmlDeviceGetUUID(h):
        if isinstance(h, MigDevice):
            return h.mig_uuid
        check_lost(h)
        return h.uuid

    @wrap
    def nvmlDeviceGetName(h):
        check_lost(h)
        return dev(h).name

    @wrap
    def nvmlDeviceGetPciInfo(h):
        check_lost(h)
        return Obj(pciDeviceId=dev(h).pci_device_id, busId=b"0000:00:00.0")

    @wrap
    def nvmlDeviceGetMemoryInfo(h):
        if isinstance(h, MigDevice):
            inst = next(i for i in sim.mig_instances(h.uuid) if i.gpu_instance_id == h.gi)
            used = sum(
                p.used_memory_mib or 0 for p in sim.processes(h.uuid) if p.gpu_instance_id == h.gi
            )
            return Obj(total=(inst.memory_mib or 0) * MIB, used=used * MIB, free=0)
        check_lost(h)
        used = sum(p.used_memory_mib or 0 for p in sim.processes(h.uuid))
        total = dev(h).memory_total_mib
        return Obj(total=total * MIB, used=used * MIB, free=(total - used) * MIB)

    @wrap
    def nvmlDeviceGetMigMode(h):
        check_lost(h)
        d = dev(h)
        if not d.mig_capable:
            raise b.NotSupported("not MIG capable")
        return [int(bool(d.mig_mode_current)), int(bool(d.mig_mode_pending))]

    @wrap
    def nvmlDeviceSetMigMode(h, mode):
        try:
            sim.set_mig_mode(h.uuid, bool(mode))
        except b.InUse:
            return 19
        return 0

    def profiles(uuid):
        return sim.possible_placements(uuid)

    @wrap
    def nvmlDeviceGetGpuInstanceProfileInfo(h, const, version=2):
        check_lost(h)
        if const >= real.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise b.InvalidPlacement("bad constant")
        ps = profiles(h.uuid)
        if const >= len(ps):
            raise b.NotSupported("profile not supported")
        p = ps[const]
        return Obj(
            id=p.profile_id,
            sliceCount=p.compute_slices,
            instanceCount=p.max_instances,
            memorySizeMB=p.memory_mib,
            name=p.name.encode(),
        )

    @wrap
    def nvmlDeviceGetGpuInstancePossiblePlacements(h, pid, array, count_ref):
        p = next(p for p in profiles(h.uuid) if p.profile_id == pid)
        for i, (start, size) in enumerate(p.placements):
            array[i].start = start
            array[i].size = size
        count_ref._obj.value = len(p.placements)
        return 0

    def gis(uuid):
        seen = {}
        for inst in sim.mig_instances(uuid):
            seen.setdefault(inst.gpu_instance_id, inst)
        return seen

    @wrap
    def nvmlDeviceGetGpuInstances(h, pid, array, count_ref):
        found = [gi for gi, inst in sorted(gis(h.uuid).items()) if inst.profile_id == pid]
        for i, gi in enumerate(found):
            array[i] = handle("gi", h.uuid, gi)
        count_ref._obj.value = len(found)
        return 0

    @wrap
    def nvmlDeviceGetGpuInstanceById(h, gi):
        if gi not in gis(h.uuid):
            raise b.NotFound(str(gi))
        return handle("gi", h.uuid, gi)

    @wrap
    def nvmlGpuInstanceGetInfo(gh):
        _, uuid, gi = handles[gh]
        inst = gis(uuid)[gi]
        return Obj(
            id=gi, profileId=inst.profile_id, placement=Obj(start=inst.start, size=inst.size)
        )

    @wrap
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(gh, const, eng, version=2):
        if const != 0:
            raise b.NotSupported("only the full-size CI profile is simulated")
        return Obj(id=0, sliceCount=1, instanceCount=1)

    @wrap
    def nvmlGpuInstanceGetComputeInstances(gh, pid, array, count_ref):
        _, uuid, gi = handles[gh]
        cis = [
            i.compute_instance_id
            for i in sim.mig_instances(uuid)
            if i.gpu_instance_id == gi and i.compute_instance_id is not None
        ]
        for i, ci in enumerate(cis):
            array[i] = handle("ci", uuid, gi, ci)
        count_ref._obj.value = len(cis)
        return 0

    @wrap
    def nvmlComputeInstanceGetInfo(ch):
        return Obj(id=handles[ch][3])

    @wrap
    def nvmlGpuInstanceGetComputeInstanceById(gh, ci):
        _, uuid, gi = handles[gh]
        return handle("ci", uuid, gi, ci)

    @wrap
    def nvmlDeviceCreateGpuInstanceWithPlacement(h, pid, placement_ref):
        inst = sim.create_gpu_instance(h.uuid, pid, placement_ref._obj.start)
        return handle("gi", h.uuid, inst.gpu_instance_id)

    @wrap
    def nvmlGpuInstanceCreateComputeInstance(gh, pid):
        _, uuid, gi = handles[gh]
        inst = sim.create_compute_instance(uuid, gi)
        return handle("ci", uuid, gi, inst.compute_instance_id)

    @wrap
    def nvmlComputeInstanceDestroy(ch):
        _, uuid, gi, ci = handles[ch]
        sim.destroy_compute_instance(uuid, gi, ci)

    @wrap
    def nvmlGpuInstanceDestroy(gh):
        _, uuid, gi = handles[gh]
        sim.destroy_gpu_instance(uuid, gi)

    def migs(uuid):
        return [i for i in sim.mig_instances(uuid) if i.uuid is not None]

    @wrap
    def nvmlDeviceGetMaxMigDeviceCount(h):
        return 7 if dev(h).mig_capable else 0

    @wrap
    def nvmlDeviceGetMigDeviceHandleByIndex(h, i):
        found = migs(h.uuid)
        if i >= len(found):
            raise b.NotFound(str(i))
        m = found[i]
        return MigDevice(h.uuid, m.gpu_instance_id, m.compute_instance_id or 0, m.uuid or "")

    @wrap
    def nvmlDeviceGetGpuInstanceId(m):
        return m.gi

    @wrap
    def nvmlDeviceGetComputeInstanceId(m):
        return m.ci

    @wrap
    def nvmlDeviceGetComputeRunningProcesses(h):
        return [
            Obj(
                pid=p.pid,
                usedGpuMemory=None if p.used_memory_mib is None else p.used_memory_mib * MIB,
                gpuInstanceId=NO_ID if p.gpu_instance_id is None else p.gpu_instance_id,
                computeInstanceId=NO_ID if p.compute_instance_id is None else p.compute_instance_id,
            )
            for p in sim.processes(h.uuid)
        ]

    @wrap
    def nvmlDeviceGetUtilizationRates(h):
        s = sim.sample(h.uuid)
        if s.utilization_gpu_percent is None:
            raise b.NotSupported("MIG enabled")
        return Obj(gpu=int(s.utilization_gpu_percent), memory=0)

    @wrap
    def nvmlDeviceGetTemperatureV(h, sensor):
        check_lost(h)
        return 35

    @wrap
    def nvmlDeviceGetPowerUsage(h):
        check_lost(h)
        return 70_000

    @wrap
    def nvmlDeviceGetTotalEccErrors(h, error_type, counter):
        s = sim.sample(h.uuid)
        return s.ecc_uncorrected if error_type == 1 else s.ecc_corrected

    @wrap
    def nvmlGpmQueryDeviceSupport(h):
        if is_ampere(dev(h).name):
            raise b.NotSupported("no GPM before Hopper")
        return Obj(isSupportedDevice=1)

    @wrap
    def nvmlGpmSampleAlloc():
        return Obj(util=None)

    @wrap
    def nvmlGpmMigSampleGet(h, gi, sample):
        mig = next(m for m in sim.sample(h.uuid).mig if m.gpu_instance_id == gi)
        sample.util = mig.utilization_percent
        return sample

    @wrap
    def nvmlGpmSampleFree(sample):
        return None

    @wrap
    def nvmlGpmMetricsGet(mg):
        mg.metrics[0].value = mg.sample2.util
        mg.metrics[0].nvmlReturn = 0
        return mg

    @wrap
    def nvmlEventSetCreate():
        return Obj(name="event-set")

    @wrap
    def nvmlEventSetFree(es):
        return None

    @wrap
    def nvmlDeviceGetSupportedEventTypes(h):
        return 0x8 | 0x1 | 0x2 | 0x4

    @wrap
    def nvmlDeviceRegisterEvents(h, mask, es):
        return None

    @wrap
    def nvmlEventSetWait(es, timeout_ms):
        state["events"].extend(sim.wait_events(0))
        if not state["events"]:
            raise real.NVMLError(10)
        e = state["events"].pop(0)
        return Obj(
            device=Device(e.gpu_uuid),
            eventType=0x8 if e.kind == "xid" else 0x2,
            eventData=e.xid or 0,
            gpuInstanceId=NO_ID if e.gpu_instance_id is None else e.gpu_instance_id,
            computeInstanceId=NO_ID,
        )

    return mod
