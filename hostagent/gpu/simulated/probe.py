"""The simulator's ``probe()`` record, shaped like the NVML backend's
(:mod:`hostagent.gpu.nvml_probe`, ``fleet-agent --probe --json``) and filled from the simulated
state, so tools that read records (and the test double that replays them) take either. Reads only.

What the simulator does not know is ``None``: SM counts, the CUDA driver version. NVML profile
constants are derived from the profile names as facts §1.1 pairs them (◐ inferred there).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from hostagent import __version__
from hostagent.gpu.backend import driver_branch
from hostagent.gpu.simulated.model import Gpu, GpuInstance, is_ampere

if TYPE_CHECKING:
    from hostagent.gpu.simulated.backend import SimulatedBackend

PROBE_VERSION = 1
MPS_SERVER_NAME = "nvidia-cuda-mps-server"
WORKLOAD_NAME = "python3"
COMPUTE_MODES = {"default": 0, "exclusive_process": 3}
"""``nvmlComputeMode_t``: NVML_COMPUTEMODE_DEFAULT 0, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS 3."""
SUPPORTED_EVENTS = 0x1 | 0x2 | 0x8
"""Single-bit ECC, double-bit ECC, Xid (``nvmlEventType*``)."""

# NVML_GPU_INSTANCE_PROFILE_* by compute slices and suffix (nvml.h; facts §1.1).
_GI_CONSTANTS: dict[tuple[str, int], int] = {
    **{("", n): c for n, c in ((1, 0), (2, 1), (3, 2), (4, 3), (7, 4), (8, 5), (6, 6))},
    ("+me", 1): 0x7,
    ("+me", 2): 0x8,
    ("double", 1): 0x9,
    ("+gfx", 1): 0xA,
    ("+gfx", 2): 0xB,
    ("+gfx", 4): 0xC,
    ("-me", 1): 0xD,
    ("-me", 2): 0xE,
    ("+me.all", 1): 0xF,
    ("+me.all", 2): 0x10,
    ("+gfx", 3): 0x11,
}
_CI_CONSTANTS = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
_SUFFIX = re.compile(r"(\+me\.all|\+me|-me|\+gfx)$")


def _gi_constant(g: Gpu, profile: dict[str, Any]) -> int | None:
    suffix_match = _SUFFIX.search(profile["name"])
    suffix = suffix_match.group(1) if suffix_match else ""
    slices = profile["compute_slices"]
    if not suffix and slices == 1:
        smallest = min(p["memory_slices"] for p in g.spec["profiles"] if p["compute_slices"] == 1)
        suffix = "double" if profile["memory_slices"] > smallest else ""
    return _GI_CONSTANTS.get((suffix, slices))


def _gi_profiles(backend: SimulatedBackend, g: Gpu) -> dict[str, Any]:
    """``nvmlDeviceGetGpuInstanceProfileInfoV`` for every profile, or NOT_SUPPORTED for every
    constant (a GPU without MIG, or MIG off on a driver that hides them: review D2)."""
    listed = backend.possible_placements(g.uuid) if g.spec["mig_capable"] else []
    specs = {p["id"]: p for p in g.spec["profiles"]}
    profiles = [
        {
            "constant": _gi_constant(g, dict(specs[p.profile_id])),
            "id": p.profile_id,
            "name": p.name,
            "slice_count": p.compute_slices,
            "instance_count": p.max_instances,
            "multiprocessor_count": None,
            "memory_size_mb": p.memory_mib,
            "placements": [[s, z] for s, z in p.placements],
            "placements_error": None,
        }
        for p in listed
    ]
    errors = {str(c): "NOT_SUPPORTED" for c in sorted(set(_GI_CONSTANTS.values()))}
    return {"answered": bool(profiles), "profiles": profiles, "errors": {} if listed else errors}


def _gpu_instance(gi: GpuInstance) -> dict[str, Any]:
    """A GI with the one compute-instance profile the simulator offers: the full-size one."""
    slices = gi.profile["compute_slices"]
    ci_profile = _CI_CONSTANTS.get(slices, 0)
    return {
        "id": gi.gpu_instance_id,
        "profile_id": gi.profile["id"],
        "placement": [gi.start, gi.profile["memory_slices"]],
        "compute_instance_profiles": [
            {
                "constant": ci_profile,
                "id": ci_profile,
                "name": f"{slices}c.{gi.profile['name']}",
                "slice_count": slices,
                "instance_count": 1,
                "multiprocessor_count": None,
            }
        ],
        "compute_instances": [
            {"id": ci, "profile_id": ci_profile, "start": 0} for ci in sorted(gi.compute_instances)
        ],
    }


def _processes(backend: SimulatedBackend, g: Gpu) -> dict[str, list[dict[str, Any]]]:
    """The compute list (MPS servers and clients included, ``M+C``) and the MPS client list."""

    def row(p: Any) -> dict[str, Any]:
        return {
            "pid": p.pid,
            "name": MPS_SERVER_NAME if p.kind == "mps_server" else WORKLOAD_NAME,
            "used_memory_mib": p.used_memory_mib,
            "gpu_instance_id": p.gpu_instance_id,
            "compute_instance_id": p.compute_instance_id,
        }

    processes = backend.processes(g.uuid)
    return {
        "compute": [row(p) for p in processes],
        "mps": [row(p) for p in processes if p.kind == "mps_client"],
    }


def _supports(g: Gpu, profiles_answered: bool) -> dict[str, bool | str]:
    mig = True if g.spec["mig_capable"] else "NOT_SUPPORTED"
    info: bool | str = True if profiles_answered else "NOT_SUPPORTED"
    return {
        "nvmlDeviceGetTemperatureV": True,
        "nvmlDeviceGetTemperature": True,
        "nvmlDeviceGetGpuInstanceProfileInfoV": info,
        "nvmlDeviceGetGpuInstanceProfileInfo": info,
        "nvmlDeviceGetComputeRunningProcesses_v3": True,
        "nvmlDeviceGetMPSComputeRunningProcesses_v3": True,
        "nvmlDeviceGetSupportedEventTypes": True,
        "nvmlDeviceGetPowerUsage": True,
        "nvmlDeviceGetMemoryInfo": True,
        "nvmlDeviceGetMigMode": mig,
        "nvmlDeviceGetComputeMode": True,
    }


def _gpu(backend: SimulatedBackend, g: Gpu) -> dict[str, Any]:
    if g.lost:
        return {"index": g.index, "status": "lost", "error": "GPU_IS_LOST"}
    profiles = _gi_profiles(backend, g)
    capable = g.spec["mig_capable"]
    instances = sorted(g.instances.values(), key=lambda i: i.gpu_instance_id)
    return {
        "index": g.index,
        "status": "ok",
        "uuid": g.uuid,
        "name": g.spec["name"],
        "pci_device_id": g.spec["pci_device_id"],
        "pci_bus_id": f"00000000:{0x17 + g.index:02X}:00.0",
        "memory_total_mib": g.spec["memory_mib"],
        "mig_mode": (
            {"current": int(g.mig_current), "pending": int(g.mig_pending)}
            if capable
            else "NOT_SUPPORTED"
        ),
        "compute_mode": COMPUTE_MODES[g.compute_mode],
        "supported_event_types": SUPPORTED_EVENTS,
        "gpm_supported": capable and not is_ampere(g.spec["name"]),
        "supports": _supports(g, profiles["answered"]),
        "gpu_instance_profiles": profiles,
        "gpu_instances": [_gpu_instance(gi) for gi in instances] if g.mig_current else [],
        "mig_devices": [
            {
                "gpu_instance_id": gi.gpu_instance_id,
                "compute_instance_id": ci,
                "uuid": uuid,
                "memory_total_mib": gi.profile["memory_mib"],
            }
            for gi in instances
            for ci, uuid in sorted(gi.compute_instances.items())
        ],
        "processes": _processes(backend, g),
    }


def probe_record(backend: SimulatedBackend, gpus: list[Gpu]) -> dict[str, Any]:
    """The whole record: library, driver, then one entry per GPU index."""
    version = backend.driver_version()
    record: dict[str, Any] = {
        "probe_version": PROBE_VERSION,
        "agent_version": __version__,
        "backend": backend.kind,
        "available": backend.available(),
        "euid": os.geteuid() if hasattr(os, "geteuid") else None,
        "driver_version": version,
        "driver_branch": driver_branch(version),
        "nvml_version": backend.nvml_version(),
        "cuda_driver_version": None,
        "gpus": [],
    }
    if backend.available():
        record["gpus"] = [_gpu(backend, g) for g in gpus]
    return record
