"""Telemetry reads over NVML that need more than one call: processes, temperature and GPM.

* Processes (review D5): NVML lists ``nvidia-cuda-mps-server`` among the compute processes,
  and the MPS clients through ``nvmlDeviceGetMPSComputeRunningProcesses``. The server is told by
  its process name (``nvmlSystemGetProcessName``): it stays listed after its last client left,
  so "listed as compute but not as MPS" cannot tell it from a plain CUDA process. A process
  whose name NVML will not give (another PID namespace) counts as a workload, the safe side:
  it blocks a destroy rather than letting one through.
* Temperature (review D6): ``nvmlDeviceGetTemperatureV`` is in the binding but the driver
  symbol first ships with NVML 12.8 (R570); the legacy call is used where it is missing.
* GPM (review D12): one sample per GI per tick, shared by its compute instances; baselines are
  keyed on (GI id, profile, start) and freed when the GI is gone or a sample fails.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hostagent.gpu.backend import BackendError, ProcessKind, ProcessSample
from hostagent.gpu.nvml_lib import (
    ABSENT,
    ARGUMENT_VERSION_MISMATCH,
    FUNCTION_NOT_FOUND,
    GPU_IS_LOST,
    SUCCESS,
    UNAVAILABLE,
    Answer,
    Nvml,
)

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
NO_INSTANCE = 0xFFFFFFFF
MPS_SERVER_NAME = "nvidia-cuda-mps-server"
GPM_MIN_INTERVAL_S = 0.1  # nvml.h: GPM samples must be > 100 ms apart (internal refresh rate)
TEMPERATURE_V = "nvmlDeviceGetTemperatureV"
TEMPERATURE_LEGACY = "nvmlDeviceGetTemperature"

GiKey = tuple[int, int | None, int | None]
"""A GPU instance as GPM baselines know it: (GI id, profile id, placement start)."""


def _raise_if_gpu_gone(answer: Answer) -> None:
    if answer.code == GPU_IS_LOST or answer.code in UNAVAILABLE:
        raise answer.error()


def instance_id(value: Any) -> int | None:
    """A GI or CI id of a process; ``None`` for 0xFFFFFFFF (MIG off) or absent."""
    return None if value in (None, NO_INSTANCE) else int(value)


def process_list(nv: Nvml, handle: Any, call: str) -> list[Any]:
    """``call`` (the binding's ``_v3``), then ``call + "_v2"`` where the driver predates R510.

    Raises the translated error when neither answers with a list (absent → ``[]``).
    """
    answer = nv.attempt(call, handle)
    if answer.code == FUNCTION_NOT_FOUND:
        answer = nv.attempt(call + "_v2", handle)
    if answer.ok:
        return list(answer.value or [])
    if answer.code == FUNCTION_NOT_FOUND:
        return []
    raise answer.error()


def _is_mps_server(nv: Nvml, pid: int) -> bool:
    answer = nv.attempt("nvmlSystemGetProcessName", pid)
    name = answer.value.decode() if isinstance(answer.value, bytes) else answer.value
    return bool(answer.ok and isinstance(name, str) and MPS_SERVER_NAME in name)


def read_processes(nv: Nvml, handle: Any) -> list[ProcessSample]:
    """Compute processes and MPS clients of a GPU, each once, told apart by ``kind``."""
    compute = process_list(nv, handle, "nvmlDeviceGetComputeRunningProcesses")
    try:
        clients = process_list(nv, handle, "nvmlDeviceGetMPSComputeRunningProcesses")
    except BackendError as exc:  # clients are detail; the compute list decides what blocks
        logger.debug("MPS process list unreadable: %s", exc)
        clients = []
    client_pids = {int(p.pid) for p in clients}
    # Clients may be listed by both calls ("M+C" in nvidia-smi): the MPS entry wins.
    entries = {int(p.pid): p for p in compute} | {int(p.pid): p for p in clients}
    out = []
    for pid, p in entries.items():
        kind: ProcessKind = "compute"
        if _is_mps_server(nv, pid):
            kind = "mps_server"
        elif pid in client_pids:
            kind = "mps_client"
        used = getattr(p, "usedGpuMemory", None)
        out.append(
            ProcessSample(
                pid=pid,
                used_memory_mib=int(used) // MIB if used is not None else None,
                gpu_instance_id=instance_id(getattr(p, "gpuInstanceId", None)),
                compute_instance_id=instance_id(getattr(p, "computeInstanceId", None)),
                kind=kind,
            )
        )
    return sorted(out, key=lambda p: p.pid)


class TemperatureReader:
    """``nvmlDeviceGetTemperatureV`` where the driver has it, else the legacy call; the choice
    is remembered per GPU."""

    def __init__(self, nv: Nvml) -> None:
        self._nv = nv
        self._call: dict[str, str] = {}

    def read(self, gpu: str, handle: Any) -> int | None:
        """Degrees Celsius of ``NVML_TEMPERATURE_GPU``; ``None`` when NVML has none."""
        sensor = self._nv.constant("NVML_TEMPERATURE_GPU", 0)
        call = self._call.get(gpu, TEMPERATURE_V)
        answer = self._nv.attempt(call, handle, sensor)
        if call == TEMPERATURE_V and answer.code in (FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH):
            call = TEMPERATURE_LEGACY
            answer = self._nv.attempt(call, handle, sensor)
        if answer.ok or answer.code != FUNCTION_NOT_FOUND:
            self._call[gpu] = call
        _raise_if_gpu_gone(answer)
        return int(answer.value) if answer.ok else None


class GpmTracker:
    """SM utilisation per GI from GPM samples one tick apart (Hopper and later).

    Keeps the previous sample instead of sleeping 100 ms inside the tick; the first tick of a GI
    gives ``None``.
    """

    def __init__(self, nv: Nvml) -> None:
        self._nv = nv
        self._supported: dict[str, bool] = {}
        self._prev: dict[str, dict[GiKey, tuple[Any, float]]] = {}

    def supported(self, gpu: str, handle: Any) -> bool:
        """``nvmlGpmQueryDeviceSupport``, remembered once NVML answered."""
        known = self._supported.get(gpu)
        if known is not None:
            return known
        answer = self._nv.attempt("nvmlGpmQueryDeviceSupport", handle)
        _raise_if_gpu_gone(answer)
        if answer.ok or answer.code in ABSENT:  # a transient error is asked again next tick
            self._supported[gpu] = bool(answer.ok and answer.value.isSupportedDevice)
        return self._supported.get(gpu, False)

    def utilisation(
        self, gpu: str, handle: Any, instances: dict[int, GiKey]
    ) -> dict[int, float | None]:
        """One value per GI id for this tick; baselines of GIs that are gone are freed."""
        prev = self._prev.setdefault(gpu, {})
        for key in [k for k in prev if k not in instances.values()]:
            self._nv.quiet("nvmlGpmSampleFree", prev.pop(key)[0])
        return {gi: self._sample(gpu, handle, key) for gi, key in instances.items()}

    def release(self, gpu: str | None = None) -> None:
        """Free every kept sample (of one GPU, or all) and forget GPM support."""
        for name in [gpu] if gpu is not None else list(self._prev):
            for sample, _ in self._prev.pop(name, {}).values():
                self._nv.quiet("nvmlGpmSampleFree", sample)
            self._supported.pop(name, None)

    def _sample(self, gpu: str, handle: Any, key: GiKey) -> float | None:
        alloc = self._nv.attempt("nvmlGpmSampleAlloc")
        if not alloc.ok:
            return None
        sample = alloc.value
        got = self._nv.attempt("nvmlGpmMigSampleGet", handle, key[0], sample)
        if not got.ok:
            self._nv.quiet("nvmlGpmSampleFree", sample)
            if got.code == FUNCTION_NOT_FOUND:  # NVML before 12.0 (go-nvml 399f8e0)
                self._supported[gpu] = False
            logger.debug("GPM sample of %s/%s failed: %s", gpu, key[0], got.text)
            return None
        now = time.monotonic()
        prev = self._prev[gpu]
        previous = prev.get(key)
        if previous is not None and now - previous[1] < GPM_MIN_INTERVAL_S:
            self._nv.quiet("nvmlGpmSampleFree", sample)
            return None
        prev[key] = (sample, now)
        if previous is None:
            return None
        try:
            return self._sm_util(previous[0], sample)
        finally:
            self._nv.quiet("nvmlGpmSampleFree", previous[0])

    def _sm_util(self, first: Any, second: Any) -> float | None:
        nv = self._nv.module
        metrics = nv.c_nvmlGpmMetricsGet_t()
        metrics.version = nv.NVML_GPM_METRICS_GET_VERSION
        metrics.numMetrics = 1
        metrics.sample1 = first
        metrics.sample2 = second
        metrics.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
        if not self._nv.attempt("nvmlGpmMetricsGet", metrics).ok:
            return None
        result = metrics.metrics[0]
        return round(float(result.value), 1) if int(result.nvmlReturn) == SUCCESS else None
