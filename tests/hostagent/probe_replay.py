"""Replay a ``fleet-agent --probe --json`` record as fake hardware, and read records from disk.

``FakeHardware.from_probe(record)`` answers like the probed host: same GPUs, UUIDs, raw profile
names, NVML constants, placements, SM counts, compute-instance profiles of the GIs that existed,
instances, processes and supported calls. What a record cannot say (profiles the driver hid,
CI profiles of GIs that did not exist) falls back to the model in :mod:`tests.hostagent.fake_gpu`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleet.mig.catalog import find_product
from tests.hostagent.fake_gpu import (
    CiProfile,
    DriverProfile,
    FakeCi,
    FakeGi,
    FakeGpu,
    FakeHardware,
    FakeProc,
    GiProfile,
)

FIXTURES = Path(__file__).parent / "fixtures"
_MISSING = "FUNCTION_NOT_FOUND"


def records() -> list[tuple[Path, dict[str, Any]]]:
    """Every probe record kept in ``tests/hostagent/fixtures/*.json``."""
    return [(path, json.loads(path.read_text())) for path in sorted(FIXTURES.glob("*.json"))]


def _supported(record: dict[str, Any], call: str) -> bool:
    answers = [g["supports"].get(call) for g in record["gpus"] if g.get("status") == "ok"]
    return all(a != _MISSING for a in answers)


def privileged(record: dict[str, Any]) -> bool:
    """False when the record shows the non-root answer to the placements call."""
    return not any(
        p["placements_error"] == "NO_PERMISSION"
        for g in record["gpus"]
        if g.get("status") == "ok"
        for p in g["gpu_instance_profiles"]["profiles"]
    )


def driver_of(record: dict[str, Any]) -> DriverProfile:
    """The driver behaviour a record shows."""
    hidden = any(
        isinstance(g.get("mig_mode"), dict)
        and not g["mig_mode"]["current"]
        and not g["gpu_instance_profiles"]["answered"]
        for g in record["gpus"]
        if g.get("status") == "ok"
    )
    return DriverProfile(
        name="replay",
        driver_version=record["driver_version"],
        nvml_version=record["nvml_version"],
        cuda_driver_version=record.get("cuda_driver_version") or 0,
        profiles_need_mig=hidden,
        temperature_v=_supported(record, "nvmlDeviceGetTemperatureV"),
        profile_info_v=_supported(record, "nvmlDeviceGetGpuInstanceProfileInfoV"),
        processes_v3=_supported(record, "nvmlDeviceGetComputeRunningProcesses_v3"),
        gpm=_supported(record, "nvmlGpmQueryDeviceSupport"),
        profile_name_prefix="",
        profile_constants=_known_profile_constants(record),
        default_gpus=(),
    )


def _known_profile_constants(record: dict[str, Any]) -> int | None:
    """The lowest profile constant the driver called an INVALID_ARGUMENT, if any."""
    unknown = [
        int(constant)
        for g in record["gpus"]
        if g.get("status") == "ok"
        for constant, error in g["gpu_instance_profiles"]["errors"].items()
        if error == "INVALID_ARGUMENT"
    ]
    return min(unknown, default=None)


def _gi_profile(p: dict[str, Any]) -> GiProfile:
    placements = tuple((s, z) for s, z in p["placements"] or ())
    return GiProfile(
        constant=p["constant"],
        id=p["id"],
        name=p["name"] or "",
        slices=p["slice_count"],
        memory_slices=placements[0][1] if placements else 0,
        memory_mib=p["memory_size_mb"],
        instance_count=p["instance_count"],
        sms=p["multiprocessor_count"],
        placements=placements,
    )


def _ci_profile(p: dict[str, Any]) -> CiProfile:
    return CiProfile(
        constant=p["constant"],
        id=p["id"],
        name=p["name"] or "",
        slices=p["slice_count"],
        instance_count=p["instance_count"],
        sms=p["multiprocessor_count"],
    )


def load_gpu(hw: FakeHardware, index: int, g: dict[str, Any]) -> FakeGpu:
    """One GPU of a record, with its MIG state and processes."""
    if g.get("status") != "ok":
        gpu = FakeGpu(index, g.get("uuid") or f"GPU-lost-{index}", "", 0, "", 0, False, 0, [])
        gpu.lost_code = 15 if g.get("error") == "GPU_IS_LOST" else 999
        return gpu
    modes = g["mig_mode"] if isinstance(g["mig_mode"], dict) else None
    gpu = FakeGpu(
        index=index,
        uuid=g["uuid"],
        name=g["name"],
        pci_device_id=g["pci_device_id"],
        bus_id=g["pci_bus_id"],
        memory_mib=g["memory_total_mib"] or 0,
        mig_capable=modes is not None,
        compute_slices=max(
            (p["slice_count"] for p in g["gpu_instance_profiles"]["profiles"]), default=7
        ),
        profiles=[_gi_profile(p) for p in g["gpu_instance_profiles"]["profiles"]],
        mig_current=bool(modes and modes["current"]),
        mig_pending=bool(modes and modes["pending"]),
        compute_mode=g["compute_mode"] or 0,
        supported_events=g["supported_event_types"] or 0,
    )
    _load_instances(hw, gpu, g)
    _load_processes(hw, gpu, g)
    return gpu


def _load_instances(hw: FakeHardware, gpu: FakeGpu, g: dict[str, Any]) -> None:
    uuids = {(m["gpu_instance_id"], m["compute_instance_id"]): m["uuid"] for m in g["mig_devices"]}
    for rec in g["gpu_instances"]:
        profile = next(p for p in gpu.profiles if p.id == rec["profile_id"])
        ci_profiles = [_ci_profile(p) for p in rec["compute_instance_profiles"]]
        gpu.ci_profiles[profile.id] = ci_profiles
        gi = FakeGi(rec["id"], profile, rec["placement"][0], serial=hw.new_serial())
        for ci in rec["compute_instances"]:
            ci_profile = next(p for p in ci_profiles if p.id == ci["profile_id"])
            gi.cis[ci["id"]] = FakeCi(ci["id"], ci_profile, ci["start"], uuids[(gi.id, ci["id"])])
        gpu.gis[gi.id] = gi


def _load_processes(hw: FakeHardware, gpu: FakeGpu, g: dict[str, Any]) -> None:
    lists = g["processes"]
    compute = lists["compute"] if isinstance(lists["compute"], list) else []
    clients = lists["mps"] if isinstance(lists["mps"], list) else []
    client_pids = {p["pid"] for p in clients}
    compute_pids = {p["pid"] for p in compute}
    for p in compute + [c for c in clients if c["pid"] not in compute_pids]:
        name = (p["name"] or "unknown").rsplit("/", 1)[-1]
        gpu.procs[p["pid"]] = FakeProc(
            pid=p["pid"],
            memory_mib=p["used_memory_mib"],
            gi=p["gpu_instance_id"],
            ci=p["compute_instance_id"],
            name=name,
            mps=p["pid"] in client_pids,
            listed_compute=p["pid"] in compute_pids,
        )
        hw.new_pid(p["pid"])


def catalog_mismatches(record: dict[str, Any]) -> list[str]:
    """Every difference between a record's profiles and the catalog's, as sentences."""
    out = []
    for gpu in record["gpus"]:
        if gpu.get("status") != "ok" or not gpu["gpu_instance_profiles"]["answered"]:
            continue
        product = find_product(name=gpu["name"], pci_device_id=gpu["pci_device_id"])
        if product is None:
            out.append(f"{gpu['name']} ({gpu['pci_device_id']:#x}) is not in the catalog")
            continue
        for p in gpu["gpu_instance_profiles"]["profiles"]:
            out.extend(_profile_mismatches(product, gpu["name"], p))
    return out


def _profile_mismatches(product: Any, gpu_name: str, p: dict[str, Any]) -> list[str]:
    listed = product.profile(p["id"])
    where = f"{gpu_name} profile {p['id']} ({p['name']})"
    if listed is None:
        return [f"{where}: not in the catalog"]
    out = []
    if p["name"] is not None and not listed.answers_to(p["name"].removeprefix("MIG ")):
        out.append(f"{where}: the catalog calls it {listed.name}")
    if p["placements"] is not None:
        theirs = [tuple(x) for x in p["placements"]]
        ours = [(x.start, x.size) for x in listed.placements]
        if sorted(theirs) != sorted(ours):
            out.append(f"{where}: NVML places it at {theirs}, the catalog at {ours}")
    return out
