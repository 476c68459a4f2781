"""``fleet-agent --probe``: a read-only record of what NVML says on this host.

The record answers the questions the review could not settle without hardware (its §6):
whether ``nvmlDeviceGetTemperatureV`` works (D6), whether GPU-instance profile info answers in
the current MIG mode (D2), the raw profile names (D18), every compute-instance profile of the
existing GIs with its ``sliceCount`` and ``multiprocessorCount`` (D8), GPM support and the
supported event mask (D7), and the compute versus MPS process lists (D5).

Only getters are called: it never changes MIG mode, instances, MPS or compute mode. Every
answer is kept, errors included (as ``NVML_ERROR_*`` names without the prefix), so the record
can be replayed by the test double (``tests/hostagent/probe_replay.py``).
"""

from __future__ import annotations

import os
from typing import Any

from hostagent import __version__
from hostagent.gpu.backend import BackendError, driver_branch
from hostagent.gpu.nvml_lib import Answer, Nvml, code_name
from hostagent.gpu.nvml_mig import MigReader
from hostagent.gpu.nvml_telemetry import MIB, instance_id, process_list

PROBE_VERSION = 1

Record = dict[str, Any]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error(answer: Answer) -> str:
    return code_name(answer.code if answer.code is not None else 0)


def _int(answer: Answer) -> int | None:
    return int(answer.value) if answer.ok else None


def probe_host(nv: Nvml, mig: MigReader, *, available: bool) -> Record:
    """The whole record: library, driver, then one entry per GPU index."""
    record: Record = {
        "probe_version": PROBE_VERSION,
        "agent_version": __version__,
        "backend": "nvml",
        "available": available,
        "euid": os.geteuid() if hasattr(os, "geteuid") else None,
        "driver_version": None,
        "driver_branch": None,
        "nvml_version": None,
        "cuda_driver_version": None,
        "gpus": [],
    }
    if not available:
        return record
    driver = nv.attempt("nvmlSystemGetDriverVersion")
    nvml = nv.attempt("nvmlSystemGetNVMLVersion")
    record["driver_version"] = _text(driver.value) if driver.ok else None
    record["driver_branch"] = driver_branch(record["driver_version"])
    record["nvml_version"] = _text(nvml.value) if nvml.ok else None
    record["cuda_driver_version"] = _int(nv.attempt("nvmlSystemGetCudaDriverVersion_v2"))
    count = nv.attempt("nvmlDeviceGetCount")
    if not count.ok:
        record["device_count_error"] = _error(count)
        return record
    record["gpus"] = [_gpu(nv, mig, index) for index in range(int(count.value))]
    return record


def _gpu(nv: Nvml, mig: MigReader, index: int) -> Record:
    handle = nv.attempt("nvmlDeviceGetHandleByIndex", index)
    uuid = nv.attempt("nvmlDeviceGetUUID", handle.value) if handle.ok else handle
    if not uuid.ok:
        return {"index": index, "status": "lost", "error": _error(uuid)}
    h = handle.value
    name = nv.attempt("nvmlDeviceGetName", h)
    pci = nv.attempt("nvmlDeviceGetPciInfo", h)
    memory = nv.attempt("nvmlDeviceGetMemoryInfo", h)
    modes = nv.attempt("nvmlDeviceGetMigMode", h)
    mig_on = bool(modes.ok and modes.value[0])
    return {
        "index": index,
        "status": "ok",
        "uuid": _text(uuid.value),
        "name": _text(name.value) if name.ok else None,
        "pci_device_id": int(pci.value.pciDeviceId) if pci.ok else None,
        "pci_bus_id": _text(pci.value.busId) if pci.ok else None,
        "memory_total_mib": int(memory.value.total) // MIB if memory.ok else None,
        "mig_mode": (
            {"current": int(modes.value[0]), "pending": int(modes.value[1])}
            if modes.ok
            else _error(modes)
        ),
        "compute_mode": _int(nv.attempt("nvmlDeviceGetComputeMode", h)),
        "supported_event_types": _int(nv.attempt("nvmlDeviceGetSupportedEventTypes", h)),
        "gpm_supported": _gpm(nv, h),
        "supports": _supports(nv, h),
        "gpu_instance_profiles": _gi_profiles(nv, mig, h),
        "gpu_instances": _gpu_instances(nv, mig, _text(uuid.value), h) if mig_on else [],
        "mig_devices": _mig_devices(nv, mig, h) if mig_on else [],
        "processes": {
            "compute": _processes(nv, h, "nvmlDeviceGetComputeRunningProcesses"),
            "mps": _processes(nv, h, "nvmlDeviceGetMPSComputeRunningProcesses"),
        },
    }


def _supports(nv: Nvml, h: Any) -> dict[str, bool | str]:
    """Each optional call tried once: ``True``, or the error it answered."""
    sensor = nv.constant("NVML_TEMPERATURE_GPU", 0)
    calls: dict[str, tuple[str, tuple[Any, ...]]] = {
        "nvmlDeviceGetTemperatureV": ("nvmlDeviceGetTemperatureV", (h, sensor)),
        "nvmlDeviceGetTemperature": ("nvmlDeviceGetTemperature", (h, sensor)),
        "nvmlDeviceGetGpuInstanceProfileInfoV": ("nvmlDeviceGetGpuInstanceProfileInfo", (h, 0, 2)),
        "nvmlDeviceGetGpuInstanceProfileInfo": ("nvmlDeviceGetGpuInstanceProfileInfo", (h, 0, 1)),
        "nvmlDeviceGetComputeRunningProcesses_v3": ("nvmlDeviceGetComputeRunningProcesses", (h,)),
        "nvmlDeviceGetComputeRunningProcesses_v2": (
            "nvmlDeviceGetComputeRunningProcesses_v2",
            (h,),
        ),
        "nvmlDeviceGetMPSComputeRunningProcesses_v3": (
            "nvmlDeviceGetMPSComputeRunningProcesses",
            (h,),
        ),
        "nvmlGpmQueryDeviceSupport": ("nvmlGpmQueryDeviceSupport", (h,)),
        "nvmlDeviceGetSupportedEventTypes": ("nvmlDeviceGetSupportedEventTypes", (h,)),
        "nvmlDeviceGetUtilizationRates": ("nvmlDeviceGetUtilizationRates", (h,)),
        "nvmlDeviceGetPowerUsage": ("nvmlDeviceGetPowerUsage", (h,)),
        "nvmlDeviceGetMemoryInfo": ("nvmlDeviceGetMemoryInfo", (h,)),
        "nvmlDeviceGetTotalEccErrors": ("nvmlDeviceGetTotalEccErrors", (h, 1, 0)),
        "nvmlDeviceGetMigMode": ("nvmlDeviceGetMigMode", (h,)),
        "nvmlDeviceGetComputeMode": ("nvmlDeviceGetComputeMode", (h,)),
        "nvmlDeviceGetMaxMigDeviceCount": ("nvmlDeviceGetMaxMigDeviceCount", (h,)),
    }
    out: dict[str, bool | str] = {}
    for key, (call, args) in calls.items():
        answer = nv.attempt(call, *args)
        out[key] = True if answer.ok else _error(answer)
    return out


def _gpm(nv: Nvml, h: Any) -> bool | str:
    answer = nv.attempt("nvmlGpmQueryDeviceSupport", h)
    return bool(answer.value.isSupportedDevice) if answer.ok else _error(answer)


def _gi_profiles(nv: Nvml, mig: MigReader, h: Any) -> Record:
    """Every ``NVML_GPU_INSTANCE_PROFILE_*`` constant: the profile and its placements, or the
    error (NOT_SUPPORTED for all of them while MIG is off on R535)."""
    profiles = []
    errors: dict[str, str] = {}
    for constant in range(nv.constant("NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12)):
        answer = mig.gi_profile_answer(h, constant)
        if not answer.ok:
            errors[str(constant)] = _error(answer)
            continue
        info = answer.value
        placements = mig.placements_answer(h, int(info.id))
        profiles.append(
            {
                "constant": constant,
                "id": int(info.id),
                "name": _text(info.name) if hasattr(info, "name") else None,
                "slice_count": int(info.sliceCount),
                "instance_count": int(info.instanceCount),
                "multiprocessor_count": int(info.multiprocessorCount),
                "memory_size_mb": int(info.memorySizeMB),
                "placements": [list(p) for p in placements.value] if placements.ok else None,
                "placements_error": None if placements.ok else _error(placements),
            }
        )
    return {"answered": bool(profiles), "profiles": profiles, "errors": errors}


def _gpu_instances(nv: Nvml, mig: MigReader, uuid: str, h: Any) -> list[Record] | str:
    try:
        instances = mig.gpu_instances(uuid, h, True)
    except BackendError as exc:
        return str(exc)
    out = []
    for gi, info in sorted(instances, key=lambda pair: int(pair[1].id)):
        out.append(
            {
                "id": int(info.id),
                "profile_id": int(info.profileId),
                "placement": [int(info.placement.start), int(info.placement.size)],
                "compute_instance_profiles": _ci_profiles(nv, mig, gi),
                "compute_instances": [
                    {"id": ci, "profile_id": profile, "start": start}
                    for ci, profile, start in mig.compute_instances(gi)
                ],
            }
        )
    return out


def _ci_profiles(nv: Nvml, mig: MigReader, gi: Any) -> list[Record]:
    out = []
    for constant in range(nv.constant("NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 9)):
        answer = mig.ci_profile_answer(gi, constant)
        if answer.ok:
            info = answer.value
            out.append(
                {
                    "constant": constant,
                    "id": int(info.id),
                    "name": _text(info.name) if hasattr(info, "name") else None,
                    "slice_count": int(info.sliceCount),
                    "instance_count": int(info.instanceCount),
                    "multiprocessor_count": int(info.multiprocessorCount),
                }
            )
    return out


def _mig_devices(nv: Nvml, mig: MigReader, h: Any) -> list[Record] | str:
    try:
        devices = mig.mig_devices(h)
    except BackendError as exc:
        return str(exc)
    out = []
    for (gi, ci), device in sorted(devices.items()):
        uuid = nv.attempt("nvmlDeviceGetUUID", device)
        memory = nv.attempt("nvmlDeviceGetMemoryInfo", device)
        out.append(
            {
                "gpu_instance_id": gi,
                "compute_instance_id": ci,
                "uuid": _text(uuid.value) if uuid.ok else None,
                "memory_total_mib": int(memory.value.total) // MIB if memory.ok else None,
            }
        )
    return out


def _processes(nv: Nvml, h: Any, call: str) -> list[Record] | str:
    try:
        procs = process_list(nv, h, call)
    except BackendError as exc:
        return str(exc)
    out = []
    for p in sorted(procs, key=lambda p: int(p.pid)):
        name = nv.attempt("nvmlSystemGetProcessName", int(p.pid))
        used = getattr(p, "usedGpuMemory", None)
        out.append(
            {
                "pid": int(p.pid),
                "name": _text(name.value) if name.ok else None,
                "used_memory_mib": int(used) // MIB if used is not None else None,
                "gpu_instance_id": instance_id(getattr(p, "gpuInstanceId", None)),
                "compute_instance_id": instance_id(getattr(p, "computeInstanceId", None)),
            }
        )
    return out
