"""The NVML backend: the only module of the agent that imports ``pynvml`` (nvidia-ml-py).

Initialisation is lazy (``init()``, never at import). NVML errors are translated here, at the
boundary, the way nvitop/gpustat do it: no library or driver → :class:`GpuUnavailable` (the
agent keeps heartbeating with status ``unavailable``); NOT_SUPPORTED → the field is ``None``;
GPU_IS_LOST on one GPU → that GPU reports ``status="lost"`` while the others keep reporting.
Call shapes follow nvidia-ml-py 13.x (see the facts file §3).
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

import pynvml

from hostagent.gpu.backend import (
    BackendError,
    GpuDevice,
    GpuEvent,
    GpuLost,
    GpuSample,
    GpuUnavailable,
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
from hostagent.protocol import EventKind

logger = logging.getLogger(__name__)

T = TypeVar("T")
MIB = 1024 * 1024
NO_INSTANCE = 0xFFFFFFFF
MAX_PLACEMENTS = 32
GPM_MIN_INTERVAL_S = 0.1  # nvml.h: samples must be > 100 ms apart (internal refresh rate)

# nvmlReturn_t values (nvml.h); compared on ``NVMLError.value`` so subclasses do not matter.
_SUCCESS = 0
_UNINITIALIZED = 1
_INVALID_ARGUMENT = 2
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_NOT_FOUND = 6
_DRIVER_NOT_LOADED = 9
_TIMEOUT = 10
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_IN_USE = 19
_INSUFFICIENT_RESOURCES = 23

_UNAVAILABLE = {_UNINITIALIZED, _DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND}
_ABSENT = {_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND}

_XID_MASK = 0x8  # nvmlEventTypeXidCriticalError
_ECC_MASK = 0x1 | 0x2  # SingleBitEccError | DoubleBitEccError


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def translate(exc: BaseException) -> BackendError:
    """Map an ``NVMLError`` to the backend-neutral error classes."""
    code = _code(exc)
    text = str(exc)
    if code in _UNAVAILABLE:
        return GpuUnavailable(text)
    if code in _ABSENT:
        return NotSupported(text)
    if code == _IN_USE:
        return InUse(text)
    if code == _INSUFFICIENT_RESOURCES:
        return InsufficientResources(text)
    if code == _INVALID_ARGUMENT:
        return InvalidPlacement(text)
    if code == _GPU_IS_LOST:
        return GpuLost(text)
    if code == _NOT_FOUND:
        return NotFound(text)
    return BackendError(text)


@contextmanager
def _nvml_errors() -> Iterator[None]:
    try:
        yield
    except pynvml.NVMLError as exc:
        raise translate(exc) from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """:class:`~hostagent.gpu.backend.GpuBackend` over NVML."""

    kind = "nvml"

    def __init__(self) -> None:
        self._available = False
        self._uuids: dict[int, str] = {}
        self._profiles: dict[str, list[ProfilePlacements]] = {}
        self._gpm_supported: dict[str, bool] = {}
        self._gpm_prev: dict[tuple[str, int], tuple[Any, float]] = {}
        self._event_set: Any = None

    # -- lifecycle -------------------------------------------------------------------------

    def init(self) -> None:
        """``nvmlInit``; raise :class:`GpuUnavailable` when there is no driver or library."""
        with _nvml_errors():
            pynvml.nvmlInit()
        self._available = True

    def shutdown(self) -> None:
        """Free GPM samples and the event set, then ``nvmlShutdown``."""
        if not self._available:
            return
        for sample, _ in self._gpm_prev.values():
            self._quiet(pynvml.nvmlGpmSampleFree, sample)
        self._gpm_prev.clear()
        if self._event_set is not None:
            self._quiet(pynvml.nvmlEventSetFree, self._event_set)
            self._event_set = None
        self._quiet(pynvml.nvmlShutdown)
        self._available = False

    def available(self) -> bool:
        """True after a successful ``nvmlInit``."""
        return self._available

    @staticmethod
    def _quiet(fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except pynvml.NVMLError as exc:
            logger.debug("%s failed: %s", getattr(fn, "__name__", fn), exc)

    @staticmethod
    def _optional(fn: Callable[..., T], *args: Any) -> T | None:
        """Call ``fn``; ``None`` when NVML has no value (NOT_SUPPORTED, NO_PERMISSION, …)."""
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if _code(exc) in _ABSENT:
                return None
            raise translate(exc) from exc

    def driver_version(self) -> str | None:
        """``nvmlSystemGetDriverVersion`` (``nvidia-smi --query-gpu=driver_version``)."""
        return _text(self._optional(pynvml.nvmlSystemGetDriverVersion)) if self._available else None

    def nvml_version(self) -> str | None:
        """``nvmlSystemGetNVMLVersion``."""
        return _text(self._optional(pynvml.nvmlSystemGetNVMLVersion)) if self._available else None

    # -- discovery -------------------------------------------------------------------------

    def _handle(self, gpu: str) -> Any:
        if not self._available:
            raise GpuUnavailable("NVML is not initialised")
        with _nvml_errors():
            return pynvml.nvmlDeviceGetHandleByUUID(gpu)

    def list_gpus(self) -> list[GpuDevice]:
        """``nvmlDeviceGetCount`` and per GPU name, UUID, PCI id, memory and MIG mode."""
        if not self._available:
            return []
        with _nvml_errors():
            count = pynvml.nvmlDeviceGetCount()
        return [self._device(i) for i in range(count)]

    def _device(self, index: int) -> GpuDevice:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            self._uuids[index] = uuid
            name = _text(pynvml.nvmlDeviceGetName(handle))
            pci = pynvml.nvmlDeviceGetPciInfo(handle).pciDeviceId
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total // MIB
            modes = self._optional(pynvml.nvmlDeviceGetMigMode, handle)
        except (pynvml.NVMLError, GpuLost) as exc:
            if isinstance(exc, GpuLost) or _code(exc) == _GPU_IS_LOST:
                return self._lost_device(index)
            raise translate(exc) from exc
        return GpuDevice(
            index=index,
            uuid=uuid,
            name=name,
            pci_device_id=int(pci),
            memory_total_mib=int(total),
            mig_capable=modes is not None,
            mig_mode_current=bool(modes[0]) if modes is not None else None,
            mig_mode_pending=bool(modes[1]) if modes is not None else None,
        )

    def _lost_device(self, index: int) -> GpuDevice:
        return GpuDevice(
            index=index,
            uuid=self._uuids.get(index, f"GPU-unknown-{index}"),
            name="",
            pci_device_id=0,
            memory_total_mib=0,
            mig_capable=False,
            mig_mode_current=None,
            mig_mode_pending=None,
            status="lost",
        )

    def possible_placements(self, gpu: str) -> list[ProfilePlacements]:
        """Profiles 0..``NVML_GPU_INSTANCE_PROFILE_COUNT`` via
        ``nvmlDeviceGetGpuInstanceProfileInfo`` (skipping NOT_SUPPORTED / INVALID_ARGUMENT, as
        go-nvlib does) and ``nvmlDeviceGetGpuInstancePossiblePlacements_v2`` (``mig -lgipp``).
        Profile info is immutable for the lifetime of a MIG mode, so it is cached.
        """
        cached = self._profiles.get(gpu)
        if cached is not None:
            return cached
        handle = self._handle(gpu)
        out: list[ProfilePlacements] = []
        for const in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, const)
            except pynvml.NVMLError as exc:
                if _code(exc) in {_NOT_SUPPORTED, _INVALID_ARGUMENT, _FUNCTION_NOT_FOUND}:
                    continue
                raise translate(exc) from exc
            placements = self._placements(handle, int(info.id))
            out.append(
                ProfilePlacements(
                    profile_id=int(info.id),
                    name=_text(getattr(info, "name", b"")),
                    compute_slices=int(info.sliceCount),
                    memory_slices=placements[0][1] if placements else 0,
                    memory_mib=int(info.memorySizeMB),
                    max_instances=int(info.instanceCount),
                    placements=placements,
                )
            )
        out.sort(key=lambda p: p.profile_id)
        self._profiles[gpu] = out
        return out

    @staticmethod
    def _placements(handle: Any, profile_id: int) -> tuple[tuple[int, int], ...]:
        array = (pynvml.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
        count = ctypes.c_uint(MAX_PLACEMENTS)
        with _nvml_errors():
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                handle, profile_id, array, ctypes.byref(count)
            )
        return tuple((int(array[i].start), int(array[i].size)) for i in range(count.value))

    def _mig_enabled(self, handle: Any) -> bool:
        modes = self._optional(pynvml.nvmlDeviceGetMigMode, handle)
        return bool(modes and modes[0])

    def _gpu_instances(self, gpu: str, handle: Any) -> list[tuple[Any, Any]]:
        """``(gi handle, nvmlGpuInstanceGetInfo)`` for every GI (``mig -lgi``)."""
        out = []
        for profile in self.possible_placements(gpu):
            array = (pynvml.c_nvmlGpuInstance_t * max(profile.max_instances, 1))()
            count = ctypes.c_uint(max(profile.max_instances, 1))
            with _nvml_errors():
                pynvml.nvmlDeviceGetGpuInstances(
                    handle, profile.profile_id, array, ctypes.byref(count)
                )
                for i in range(count.value):
                    out.append((array[i], pynvml.nvmlGpuInstanceGetInfo(array[i])))
        return out

    def _compute_instance_ids(self, gi: Any) -> list[int]:
        ids: list[int] = []
        for const in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, const, 0)
            except pynvml.NVMLError as exc:
                if _code(exc) in {_NOT_SUPPORTED, _INVALID_ARGUMENT, _FUNCTION_NOT_FOUND}:
                    continue
                raise translate(exc) from exc
            n = max(int(info.instanceCount), 1)
            array = (pynvml.c_nvmlComputeInstance_t * n)()
            count = ctypes.c_uint(n)
            with _nvml_errors():
                pynvml.nvmlGpuInstanceGetComputeInstances(gi, info.id, array, ctypes.byref(count))
                ids.extend(
                    int(pynvml.nvmlComputeInstanceGetInfo(array[i]).id) for i in range(count.value)
                )
        return sorted(set(ids))

    def _mig_devices(self, handle: Any) -> dict[tuple[int, int], Any]:
        """MIG device handles by ``(gi, ci)``; empty indices are skipped like go-nvlib does."""
        out: dict[tuple[int, int], Any] = {}
        count = self._optional(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        for i in range(count):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
                gi = int(pynvml.nvmlDeviceGetGpuInstanceId(mig))
                ci = int(pynvml.nvmlDeviceGetComputeInstanceId(mig))
            except pynvml.NVMLError as exc:
                if _code(exc) in {_NOT_FOUND, _INVALID_ARGUMENT}:
                    continue
                raise translate(exc) from exc
            out[(gi, ci)] = mig
        return out

    def mig_instances(self, gpu: str) -> list[MigInstance]:
        """GIs and CIs with placements and ``MIG-…`` UUIDs (``nvidia-smi mig -lgi``/``-lci``)."""
        handle = self._handle(gpu)
        if not self._mig_enabled(handle):
            return []
        sizes = {p.profile_id: p.memory_mib for p in self.possible_placements(gpu)}
        migs = self._mig_devices(handle)
        out: list[MigInstance] = []
        for gi, info in self._gpu_instances(gpu, handle):
            base = MigInstance(
                gpu_instance_id=int(info.id),
                profile_id=int(info.profileId),
                start=int(info.placement.start),
                size=int(info.placement.size),
                memory_mib=sizes.get(int(info.profileId)),
            )
            ci_ids = self._compute_instance_ids(gi)
            if not ci_ids:
                out.append(base)
            for ci in ci_ids:
                mig = migs.get((base.gpu_instance_id, ci))
                uuid = _text(self._optional(pynvml.nvmlDeviceGetUUID, mig)) if mig else None
                out.append(replace(base, compute_instance_id=ci, uuid=uuid))
        out.sort(key=lambda m: (m.start, m.compute_instance_id or 0))
        return out

    # -- mutations -------------------------------------------------------------------------

    def set_mig_mode(self, gpu: str, enabled: bool) -> MigModeResult:
        """``nvmlDeviceSetMigMode``: the binding returns activationStatus instead of raising."""
        handle = self._handle(gpu)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        with _nvml_errors():
            status = int(pynvml.nvmlDeviceSetMigMode(handle, mode))
        self._profiles.pop(gpu, None)
        if status == _IN_USE:
            raise InUse("GPU is in use", self._pids(gpu, None))
        if status == _RESET_REQUIRED:
            return MigModeResult(ok=True, needs_reset=True)
        if status != _SUCCESS:
            raise BackendError(f"nvmlDeviceSetMigMode activation status {status}")
        modes = self._optional(pynvml.nvmlDeviceGetMigMode, handle)
        pending = bool(modes is not None and bool(modes[0]) != enabled)
        return MigModeResult(ok=True, needs_reset=pending)

    def _profile(self, gpu: str, profile_id: int) -> ProfilePlacements:
        for p in self.possible_placements(gpu):
            if p.profile_id == profile_id:
                return p
        raise InvalidPlacement(f"profile {profile_id} is not supported on {gpu}")

    def create_gpu_instance(self, gpu: str, profile_id: int, start: int) -> MigInstance:
        """``nvmlDeviceCreateGpuInstanceWithPlacement`` (``nvidia-smi mig -cgi ID:START``)."""
        handle = self._handle(gpu)
        profile = self._profile(gpu, profile_id)
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = profile.memory_slices
        with _nvml_errors():
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, profile_id, ctypes.byref(placement)
            )
            info = pynvml.nvmlGpuInstanceGetInfo(gi)
        return MigInstance(
            gpu_instance_id=int(info.id),
            profile_id=profile_id,
            start=int(info.placement.start),
            size=int(info.placement.size),
            memory_mib=profile.memory_mib,
        )

    def create_compute_instance(self, gpu: str, gpu_instance_id: int) -> MigInstance:
        """The largest compute-instance profile of the GI
        (``nvmlGpuInstanceCreateComputeInstance``, ``nvidia-smi mig -cci -gi ID``)."""
        handle = self._handle(gpu)
        with _nvml_errors():
            gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
        best: Any = None
        for const in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, const, 0)
            except pynvml.NVMLError as exc:
                if _code(exc) in {_NOT_SUPPORTED, _INVALID_ARGUMENT, _FUNCTION_NOT_FOUND}:
                    continue
                raise translate(exc) from exc
            if best is None or info.sliceCount > best.sliceCount:
                best = info
        if best is None:
            raise NotSupported(f"no compute-instance profile on GI {gpu_instance_id}")
        with _nvml_errors():
            ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, best.id)
            ci_id = int(pynvml.nvmlComputeInstanceGetInfo(ci).id)
        for inst in self.mig_instances(gpu):
            if inst.gpu_instance_id == gpu_instance_id and inst.compute_instance_id == ci_id:
                return inst
        raise NotFound(f"compute instance {gpu_instance_id}/{ci_id} vanished")

    def destroy_compute_instance(
        self, gpu: str, gpu_instance_id: int, compute_instance_id: int
    ) -> None:
        """``nvmlComputeInstanceDestroy``; IN_USE → :class:`InUse` with the PIDs found."""
        handle = self._handle(gpu)
        try:
            gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
            ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, compute_instance_id)
            pynvml.nvmlComputeInstanceDestroy(ci)
        except pynvml.NVMLError as exc:
            if _code(exc) == _IN_USE:
                raise InUse(str(exc), self._pids(gpu, gpu_instance_id)) from exc
            raise translate(exc) from exc

    def destroy_gpu_instance(self, gpu: str, gpu_instance_id: int) -> None:
        """``nvmlGpuInstanceDestroy``; IN_USE → :class:`InUse` with the PIDs found."""
        handle = self._handle(gpu)
        try:
            gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
            pynvml.nvmlGpuInstanceDestroy(gi)
        except pynvml.NVMLError as exc:
            if _code(exc) == _IN_USE:
                raise InUse(str(exc), self._pids(gpu, gpu_instance_id)) from exc
            raise translate(exc) from exc

    def _pids(self, gpu: str, gpu_instance_id: int | None) -> tuple[int, ...]:
        try:
            procs = self.processes(gpu)
        except BackendError:
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
        """``nvmlDeviceGetComputeRunningProcesses`` (memory in MiB, ``None`` if unknown)."""
        handle = self._handle(gpu)
        procs = self._optional(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            gi = getattr(p, "gpuInstanceId", NO_INSTANCE)
            ci = getattr(p, "computeInstanceId", NO_INSTANCE)
            out.append(
                ProcessSample(
                    pid=int(p.pid),
                    used_memory_mib=int(used) // MIB if used is not None else None,
                    gpu_instance_id=None if gi in (None, NO_INSTANCE) else int(gi),
                    compute_instance_id=None if ci in (None, NO_INSTANCE) else int(ci),
                )
            )
        return sorted(out, key=lambda p: p.pid)

    def _temperature(self, handle: Any) -> int | None:
        # nvmlDeviceGetTemperature is deprecated (removed in CUDA 14); prefer the V variant.
        getter = getattr(pynvml, "nvmlDeviceGetTemperatureV", None) or (
            pynvml.nvmlDeviceGetTemperature
        )
        value = self._optional(getter, handle, pynvml.NVML_TEMPERATURE_GPU)
        return int(value) if value is not None else None

    def _ecc(self, handle: Any, error_type: int) -> int | None:
        value = self._optional(
            pynvml.nvmlDeviceGetTotalEccErrors, handle, error_type, pynvml.NVML_VOLATILE_ECC
        )
        return int(value) if value is not None else None

    def sample(self, gpu: str) -> GpuSample:
        """Utilisation (``None`` on MIG-enabled GPUs, per nvml.h), memory, temperature, power,
        volatile ECC totals, processes and per-MIG memory/GPM utilisation."""
        try:
            return self._sample(gpu)
        except GpuLost:
            return GpuSample(uuid=gpu, status="lost")

    def _sample(self, gpu: str) -> GpuSample:
        handle = self._handle(gpu)
        mig = self._mig_enabled(handle)
        util = None if mig else self._optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._optional(pynvml.nvmlDeviceGetMemoryInfo, handle)
        power = self._optional(pynvml.nvmlDeviceGetPowerUsage, handle)
        return GpuSample(
            uuid=gpu,
            status="ok",
            utilization_gpu_percent=float(util.gpu) if util is not None else None,
            memory_used_mib=int(memory.used) // MIB if memory is not None else None,
            memory_total_mib=int(memory.total) // MIB if memory is not None else None,
            temperature_c=self._temperature(handle),
            power_mw=int(power) if power is not None else None,
            ecc_corrected=self._ecc(handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ecc_uncorrected=self._ecc(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            processes=tuple(self.processes(gpu)),
            mig=tuple(self._mig_samples(gpu, handle)) if mig else (),
        )

    def _mig_samples(self, gpu: str, handle: Any) -> list[MigSample]:
        out = []
        gpm = self._gpm_ok(gpu, handle)
        for (gi, ci), mig in sorted(self._mig_devices(handle).items()):
            memory = self._optional(pynvml.nvmlDeviceGetMemoryInfo, mig)
            uuid = self._optional(pynvml.nvmlDeviceGetUUID, mig)
            out.append(
                MigSample(
                    gpu_instance_id=gi,
                    compute_instance_id=ci,
                    uuid=_text(uuid) if uuid is not None else None,
                    utilization_percent=self._gpm_util(gpu, handle, gi) if gpm else None,
                    memory_used_mib=int(memory.used) // MIB if memory is not None else None,
                    memory_total_mib=int(memory.total) // MIB if memory is not None else None,
                )
            )
        return out

    def _gpm_ok(self, gpu: str, handle: Any) -> bool:
        """``nvmlGpmQueryDeviceSupport`` (Hopper and later)."""
        known = self._gpm_supported.get(gpu)
        if known is None:
            support = self._optional(pynvml.nvmlGpmQueryDeviceSupport, handle)
            known = bool(support is not None and support.isSupportedDevice)
            self._gpm_supported[gpu] = known
        return known

    def _gpm_util(self, gpu: str, handle: Any, gi: int) -> float | None:
        """SM utilisation of a GI between the previous tick's GPM sample and this one.

        Keeps the previous sample instead of sleeping 100 ms inside the tick; the first tick
        of a GI yields ``None``.
        """
        key = (gpu, gi)
        try:
            sample = pynvml.nvmlGpmSampleAlloc()
            pynvml.nvmlGpmMigSampleGet(handle, gi, sample)
        except pynvml.NVMLError as exc:
            logger.debug("GPM sample of %s/%s failed: %s", gpu, gi, exc)
            return None
        now = time.monotonic()
        previous = self._gpm_prev.get(key)
        if previous is not None and now - previous[1] < GPM_MIN_INTERVAL_S:
            self._quiet(pynvml.nvmlGpmSampleFree, sample)
            return None
        self._gpm_prev[key] = (sample, now)
        if previous is None:
            return None
        try:
            metrics = pynvml.c_nvmlGpmMetricsGet_t()
            metrics.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            metrics.numMetrics = 1
            metrics.sample1 = previous[0]
            metrics.sample2 = sample
            metrics.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
            pynvml.nvmlGpmMetricsGet(metrics)
        except pynvml.NVMLError as exc:
            logger.debug("GPM metrics of %s/%s failed: %s", gpu, gi, exc)
            return None
        finally:
            self._quiet(pynvml.nvmlGpmSampleFree, previous[0])
        result = metrics.metrics[0]
        return round(float(result.value), 1) if int(result.nvmlReturn) == _SUCCESS else None

    # -- events ----------------------------------------------------------------------------

    def _events(self) -> Any:
        """Create the event set and register Xid + ECC events on every GPU that has them."""
        if self._event_set is None:
            with _nvml_errors():
                self._event_set = pynvml.nvmlEventSetCreate()
            for device in self.list_gpus():
                if device.status != "ok":
                    continue
                handle = self._handle(device.uuid)
                supported = self._optional(pynvml.nvmlDeviceGetSupportedEventTypes, handle) or 0
                mask = (_XID_MASK | _ECC_MASK) & int(supported)
                if mask:
                    self._optional(pynvml.nvmlDeviceRegisterEvents, handle, mask, self._event_set)
        return self._event_set

    def wait_events(self, timeout_ms: int) -> list[GpuEvent]:
        """``nvmlEventSetWait``; ``NVMLError_Timeout`` means no event. Drains what is queued."""
        if not self._available:
            return []
        event_set = self._events()
        out: list[GpuEvent] = []
        wait = timeout_ms
        while len(out) < 64:
            try:
                data = pynvml.nvmlEventSetWait(event_set, wait)
            except pynvml.NVMLError as exc:
                if _code(exc) == _TIMEOUT:
                    break
                raise translate(exc) from exc
            out.append(self._event(data))
            wait = 0
        return out

    def _event(self, data: Any) -> GpuEvent:
        uuid = _text(self._optional(pynvml.nvmlDeviceGetUUID, data.device) or "GPU-unknown")
        gi = int(data.gpuInstanceId)
        kind: EventKind = "xid" if int(data.eventType) & _XID_MASK else "ecc"
        xid = int(data.eventData) if kind == "xid" else None
        detail = f"Xid {xid}" if kind == "xid" else f"ECC event 0x{int(data.eventType):x}"
        return GpuEvent(
            kind=kind,
            gpu_uuid=uuid,
            detail=detail,
            ts=time.time(),
            gpu_instance_id=None if gi == NO_INSTANCE else gi,
            xid=xid,
        )
