"""A model of NVIDIA GPUs and their driver behind the fake ``pynvml`` (tests only).

The model follows the hardware where the agent has been wrong before (review
``agent-on-real-drivers.md`` §5), selected by a **driver profile**:

* ``r470``: no V-variant profile-info symbols and no ``_v3`` process list (the binding raises
  ``NVMLLibraryMismatchError``), no GPM, no ``nvmlDeviceGetTemperatureV``;
* ``r535``: ``nvmlDeviceGetGpuInstanceProfileInfoV`` answers NOT_SUPPORTED while MIG is off
  (mig-parted discovery.go: "older drivers (e.g., 535)"), no ``nvmlDeviceGetTemperatureV``;
* ``r550``: profiles readable with MIG off, still no ``nvmlDeviceGetTemperatureV`` (NVML 12.8);
* ``r570``: everything present;
* ``ampere``: r570 on A100/A30 held by another NVML client (nvidia-persistenced): a MIG toggle
  answers activation status IN_USE and stays pending until a GPU reset;
* ``hopper``: r570 on H100/H200: a two-memory-slice ``1g`` GI offers ``1_SLICE`` (16 SMs) and
  ``1_SLICE_REV1`` (26 SMs) compute-instance profiles (go-nvml#146).

Profile constants are sparse as on real GPUs (constant ``1_SLICE`` → id 19, ``1_SLICE_REV2`` →
id 15, …; facts §1.1). The MPS server is a compute process named ``nvidia-cuda-mps-server``;
its clients are listed by both process calls (``M+C`` in ``nvidia-smi``). Errors are injected
per call and per GPU with :meth:`FakeHardware.fail`. A probe record (``fleet-agent --probe
--json``) can be replayed with :meth:`FakeHardware.from_probe`.

What is a guess rather than a documented fact is marked *[verify]*.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import subprocess
import uuid as uuidlib
from dataclasses import dataclass, field, replace
from typing import Any

import pynvml as real

from hostagent.protocol import SimulatedGpuSpec, SimulatedProfileSpec
from tests.hostagent import specs

SUCCESS = 0
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
LIB_RM_VERSION_MISMATCH = 18
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
UNKNOWN = 999

MPS_SERVER = "nvidia-cuda-mps-server"
NO_ID = 0xFFFFFFFF
XID, ECC_SINGLE, ECC_DOUBLE, PSTATE = 0x8, 0x1, 0x2, 0x4


class NvmlFailure(Exception):
    """Raised inside the model; the fake module turns it into ``pynvml.NVMLError(code)``."""

    def __init__(self, code: int, what: str = "") -> None:
        super().__init__(f"{what} (NVML {code})")
        self.code = code


# ------------------------------------------------------------------------------------------------
# Driver profiles
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DriverProfile:
    """What one driver branch (and host) does differently."""

    name: str
    driver_version: str
    nvml_version: str
    cuda_driver_version: int
    profiles_need_mig: bool = False
    temperature_v: bool = True
    profile_info_v: bool = True
    processes_v3: bool = True
    gpm: bool = True
    ci_rev1: bool = True
    holders: tuple[str, ...] = ()
    # What nvmlGpuInstanceProfileInfo_v2_t.name holds: "MIG 1g.18gb" on the H200 with R580
    # (tests/hostagent/fixtures/h200-580.159.04-mig-off.json).
    profile_name_prefix: str = "MIG "
    # The GPU-instance profile constants this driver knows; a newer library's higher constants
    # answer INVALID_ARGUMENT (R580 on the H200 did for constant 17). None: every constant.
    profile_constants: int | None = None
    default_gpus: tuple[str, ...] = ("h100", "a100", "l4")


_R570 = DriverProfile("r570", "570.133.20", "12.570.133.20", 12080)
PROFILES: dict[str, DriverProfile] = {
    "r470": DriverProfile(
        "r470",
        "470.256.02",
        "11.470.256.02",
        11040,
        profiles_need_mig=True,
        temperature_v=False,
        profile_info_v=False,
        processes_v3=False,
        gpm=False,
        ci_rev1=False,
        profile_name_prefix="",
        default_gpus=("a100", "l4"),
    ),
    "r535": DriverProfile(
        "r535", "535.183.01", "12.535.183.01", 12020, profiles_need_mig=True, temperature_v=False
    ),
    "r550": DriverProfile("r550", "550.127.05", "12.550.127.05", 12040, temperature_v=False),
    "r570": _R570,
    "ampere": replace(
        _R570, name="ampere", holders=("nvidia-persistenced",), default_gpus=("a100", "a30")
    ),
    "hopper": replace(_R570, name="hopper", default_gpus=("h100", "h200")),
}


def h200() -> SimulatedGpuSpec:
    """H200 141GB (facts §1.5; placements of the 8-unit family)."""
    spec = specs.h100()
    names = {19: "1g.18gb", 20: "1g.18gb+me", 15: "1g.35gb", 14: "2g.35gb"}
    names |= {9: "3g.71gb", 5: "4g.71gb", 0: "7g.141gb"}
    spec["name"], spec["pci_device_id"], spec["memory_mib"] = "NVIDIA H200", 0x233510DE, 143771
    spec["profiles"] = [
        {**p, "name": names[p["id"]], "memory_mib": 143771 // 8 * p["memory_slices"]}
        for p in spec["profiles"]
    ]
    return spec


SPECS = {"h100": specs.h100, "h200": h200, "a100": specs.a100, "a30": specs.a30, "l4": specs.l4}

# SMs of a GI by (compute slices, memory slices) (facts §1.5 -lgip transcripts).
_SMS = {
    "hopper": {(1, 1): 16, (1, 2): 26, (2, 2): 32, (3, 4): 60, (4, 4): 64, (7, 8): 132},
    "ampere": {(1, 1): 14, (1, 2): 14, (2, 2): 28, (3, 4): 42, (4, 4): 56, (7, 8): 98},
}
_CI_SLICES = {1: (1,), 2: (1, 2), 3: (1, 2, 3), 4: (1, 2, 4), 7: (1, 2, 3, 4, 7)}
_CI_CONST = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
CI_1_SLICE_REV1 = 7
_GI_CONST = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
_MEDIA_CONST = {
    ("+me", 1): 0x7,
    ("+me", 2): 0x8,
    ("+gfx", 1): 0xA,
    ("+gfx", 2): 0xB,
    ("+gfx", 4): 0xC,
    ("+gfx", 3): 0x11,
    ("-me", 1): 0xD,
    ("-me", 2): 0xE,
    ("+me.all", 1): 0xF,
    ("+me.all", 2): 0x10,
}


def family(name: str) -> str:
    """``ampere``, ``hopper`` or ``other`` from the product name."""
    if any(m in name for m in ("A100", "A30")):
        return "ampere"
    if any(m in name for m in ("H100", "H200", "GH200")):
        return "hopper"
    return "other"


def gi_constant(p: SimulatedProfileSpec) -> int:
    """The ``NVML_GPU_INSTANCE_PROFILE_*`` constant answering for a profile (facts §1.1)."""
    media = re.search(r"(\+me\.all|\+me|-me|\+gfx)$", p["name"])
    if media:
        return _MEDIA_CONST[(media.group(1), p["compute_slices"])]
    if p["compute_slices"] == 1 and p["memory_slices"] == 2:
        return 0x9  # 1_SLICE_REV2: "twice the amount of memory resources"
    return _GI_CONST[p["compute_slices"]]


def _uuid(*parts: object) -> str:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return str(uuidlib.UUID(bytes=digest[:16], version=4))


# ------------------------------------------------------------------------------------------------
# State
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CiProfile:
    """A compute-instance profile offered in a GI."""

    constant: int
    id: int
    name: str
    slices: int
    instance_count: int
    sms: int


@dataclass(frozen=True)
class GiProfile:
    """A GPU-instance profile (``-lgip``/``-lgipp``) and the NVML constant that answers for it."""

    constant: int
    id: int
    name: str
    slices: int
    memory_slices: int
    memory_mib: int
    instance_count: int
    sms: int
    placements: tuple[tuple[int, int], ...]


@dataclass
class FakeCi:
    id: int
    profile: CiProfile
    start: int
    uuid: str


@dataclass
class FakeGi:
    id: int
    profile: GiProfile
    start: int
    serial: int
    cis: dict[int, FakeCi] = field(default_factory=dict)


@dataclass
class FakeProc:
    pid: int
    memory_mib: int | None
    gi: int | None
    ci: int | None
    name: str
    mps: bool = False
    compute_percent: int = 100
    listed_compute: bool = True  # MPS clients are "M+C" (both lists) [verify]


@dataclass
class FakeGpu:
    index: int
    uuid: str
    name: str
    pci_device_id: int
    bus_id: str
    memory_mib: int
    mig_capable: bool
    compute_slices: int
    profiles: list[GiProfile]
    ci_profiles: dict[int, list[CiProfile]] = field(default_factory=dict)
    mig_current: bool = False
    mig_pending: bool = False
    lost_code: int | None = None
    gis: dict[int, FakeGi] = field(default_factory=dict)
    procs: dict[int, FakeProc] = field(default_factory=dict)
    compute_mode: int = 0
    holders: list[str] = field(default_factory=list)
    ecc: list[int] = field(default_factory=lambda: [0, 0])
    supported_events: int = XID | ECC_SINGLE | ECC_DOUBLE | PSTATE

    @property
    def family(self) -> str:
        return family(self.name)


@dataclass
class EventSet:
    registered: dict[str, int] = field(default_factory=dict)
    queue: list[Any] = field(default_factory=list)
    freed: bool = False
    broken: bool = False


@dataclass
class Failure:
    call: str
    code: int
    target: str | None
    arg: Any
    times: int | None


@dataclass
class GpmSample:
    id: int
    util: float | None = None
    serial: int | None = None


def _gi_profile(gpu_family: str, p: SimulatedProfileSpec, prefix: str) -> GiProfile:
    sms = _SMS.get(gpu_family, {}).get((p["compute_slices"], p["memory_slices"]), 0)
    return GiProfile(
        constant=gi_constant(p),
        id=p["id"],
        name=prefix + p["name"],
        slices=p["compute_slices"],
        memory_slices=p["memory_slices"],
        memory_mib=p["memory_mib"],
        instance_count=p["max_instances"],
        sms=sms,
        placements=tuple((s, z) for s, z in p["placements"]),
    )


# ------------------------------------------------------------------------------------------------
# The hardware
# ------------------------------------------------------------------------------------------------


class FakeHardware:
    """GPUs, their MIG state, processes and event sets, under one driver profile.

    The test-control methods share their names with ``SimulatedBackend`` (``run_process``,
    ``kill_process``, ``lose_gpu``, ``restore_gpu``, ``inject_xid``) so the backend contract can
    drive either.
    """

    def __init__(
        self,
        profile: str | DriverProfile = "r570",
        gpus: list[SimulatedGpuSpec] | None = None,
        *,
        seed: int = 7,
        root: bool = True,
    ) -> None:
        self.driver = PROFILES[profile] if isinstance(profile, str) else profile
        gpu_specs = gpus if gpus is not None else [SPECS[n]() for n in self.driver.default_gpus]
        self.seed = seed
        self.root = root
        self.gpus = [self._from_spec(i, spec) for i, spec in enumerate(gpu_specs)]
        self.initialised = False
        self.library_present = True
        self.failures: list[Failure] = []
        self.handles: dict[int, tuple[Any, ...]] = {}
        self.event_sets: list[EventSet] = []
        self.gpm_live: dict[int, GpmSample] = {}
        self.mutations: list[str] = []
        self._ids = itertools.count(1)
        self._next_pid = 4000 + seed

    def _from_spec(self, index: int, spec: SimulatedGpuSpec) -> FakeGpu:
        fam = family(spec["name"])
        gpu = FakeGpu(
            index=index,
            uuid=spec.get("uuid") or "GPU-" + _uuid(self.seed, "gpu", index),
            name=spec["name"],
            pci_device_id=spec["pci_device_id"],
            bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            memory_mib=spec["memory_mib"],
            mig_capable=spec["mig_capable"],
            compute_slices=spec["compute_slice_count"],
            profiles=[
                _gi_profile(fam, p, self.driver.profile_name_prefix) for p in spec["profiles"]
            ],
        )
        if fam == "ampere":
            gpu.holders = list(self.driver.holders)
        return gpu

    # -- lookups ---------------------------------------------------------------------------

    def gpu(self, uuid: str) -> FakeGpu:
        """The GPU with this UUID, raising what NVML raises for a lost or missing GPU."""
        found = next((g for g in self.gpus if g.uuid == uuid), None)
        if found is None:
            raise NvmlFailure(NOT_FOUND, uuid)
        if found.lost_code is not None:
            raise NvmlFailure(found.lost_code, "GPU is lost")
        return found

    def handle(self, *key: Any) -> int:
        """An integer handle for a GI or CI (NVML hands these back in ctypes arrays)."""
        for h, k in self.handles.items():
            if k == key:
                return h
        h = len(self.handles) + 1
        self.handles[h] = key
        return h

    def gi(self, h: int) -> tuple[FakeGpu, FakeGi]:
        _, uuid, gi_id = self.handles[h]
        gpu = self.gpu(uuid)
        if gi_id not in gpu.gis:
            raise NvmlFailure(INVALID_ARGUMENT, "stale GPU-instance handle")
        return gpu, gpu.gis[gi_id]

    def ci(self, h: int) -> tuple[FakeGpu, FakeGi, FakeCi]:
        _, uuid, gi_id, ci_id = self.handles[h]
        gpu = self.gpu(uuid)
        gi = gpu.gis.get(gi_id)
        if gi is None or ci_id not in gi.cis:
            raise NvmlFailure(INVALID_ARGUMENT, "stale compute-instance handle")
        return gpu, gi, gi.cis[ci_id]

    def ci_profiles(self, gpu: FakeGpu, gi: GiProfile) -> list[CiProfile]:
        """The CI profiles a GI of this profile offers (``nvidia-smi mig -lcip``)."""
        if gi.id in gpu.ci_profiles:
            return gpu.ci_profiles[gi.id]
        table = _SMS.get(gpu.family, {})
        out = []
        for s in _CI_SLICES.get(gi.slices, (gi.slices,)):
            sms = gi.sms if s == gi.slices else table.get((s, s), 0)
            rev1 = gpu.family == "hopper" and self.driver.ci_rev1 and gi.memory_slices == 2
            if s == gi.slices == 1 and rev1:
                # go-nvml#146 (H100 -lcip): 1c profile 0 has 16 SMs, 1c REV1 has the GI's 26.
                out.append(CiProfile(_CI_CONST[1], _CI_CONST[1], "1c." + gi.name, 1, 1, 16))
                out.append(CiProfile(CI_1_SLICE_REV1, CI_1_SLICE_REV1, gi.name, 1, 1, gi.sms))
                continue
            name = gi.name if s == gi.slices else f"{s}c.{gi.name}"
            out.append(CiProfile(_CI_CONST[s], _CI_CONST[s], name, s, gi.slices // s, sms))
        return out

    def mig_devices(self, gpu: FakeGpu) -> list[tuple[FakeGi, FakeCi]]:
        return [(gi, ci) for _, gi in sorted(gpu.gis.items()) for _, ci in sorted(gi.cis.items())]

    # -- failure injection -----------------------------------------------------------------

    def fail(
        self,
        call: str,
        code: int,
        *,
        gpu: str | None = None,
        arg: Any = None,
        times: int | None = None,
    ) -> None:
        """Make ``call`` raise ``NVMLError(code)``: for one GPU (or MIG device) UUID and one
        value of the call's second argument (a profile constant or id) if given; ``times``
        calls, or until :meth:`clear_failures`. ``call="nvmlInit"`` fails the init."""
        self.failures.append(Failure(call, code, gpu, arg, times))

    def clear_failures(self) -> None:
        self.failures.clear()

    def check(self, call: str, target: str | None, arg: Any = None) -> None:
        """Raise the injected failure matching this call, if any."""
        for f in self.failures:
            matches = f.target in (None, target) and f.arg in (None, arg)
            if f.call == call and matches and f.times != 0:
                if f.times is not None:
                    f.times -= 1
                raise NvmlFailure(f.code, f"injected failure of {call}")

    # -- test controls (the SimulatedBackend names) ----------------------------------------

    def run_process(
        self,
        gpu: str,
        memory_mib: int,
        *,
        gpu_instance_id: int | None = None,
        compute_percent: int = 100,
        mps: bool = False,
        name: str = "python3",
    ) -> int:
        """Start a CUDA process (an MPS client if ``mps``) on the GPU or in a GI; its PID."""
        g = self.gpu(gpu)
        ci = None
        if gpu_instance_id is not None:
            gi = g.gis.get(gpu_instance_id)
            if gi is None or not gi.cis:
                raise NvmlFailure(NOT_FOUND, f"no usable GI {gpu_instance_id}")
            ci = min(gi.cis)
        pid = self._next_pid
        self._next_pid += 1
        g.procs[pid] = FakeProc(pid, memory_mib, gpu_instance_id, ci, name, mps, compute_percent)
        return pid

    def start_mps_server(self, gpu: str, *, gpu_instance_id: int | None = None) -> int:
        """The ``nvidia-cuda-mps-server`` of a daemon: a compute process of its own (type C)."""
        return self.run_process(gpu, 30, gpu_instance_id=gpu_instance_id, name=MPS_SERVER)

    def kill_process(self, pid: int) -> None:
        for g in self.gpus:
            g.procs.pop(pid, None)

    def lose_gpu(self, gpu: str, code: int = GPU_IS_LOST) -> None:
        """The GPU falls off the bus: every call on it answers ``code`` (15, or 999 as is common
        in the field: "Unable to determine the device handle for GPU…: Unknown Error")."""
        g = next(g for g in self.gpus if g.uuid == gpu)
        g.lost_code = code
        for es in self.event_sets:
            es.registered.pop(gpu, None)  # the registration goes with the device

    def restore_gpu(self, gpu: str) -> None:
        next(g for g in self.gpus if g.uuid == gpu).lost_code = None

    def compute_mode(self, gpu: str) -> str:
        """``default`` or ``exclusive_process`` (the simulator's names)."""
        return {0: "default", 3: "exclusive_process"}.get(self.gpu(gpu).compute_mode, "other")

    def release_holders(self, gpu: str) -> None:
        """The operator stops nvidia-persistenced/DCGM on this GPU."""
        self.gpu(gpu).holders.clear()

    def inject_xid(self, gpu: str, xid: int, gpu_instance_id: int | None = None) -> None:
        self._event(gpu, XID, xid, gpu_instance_id)

    def inject_ecc(self, gpu: str, uncorrected: int = 0, corrected: int = 0) -> None:
        g = next(g for g in self.gpus if g.uuid == gpu)
        g.ecc[0] += corrected
        g.ecc[1] += uncorrected
        self._event(gpu, ECC_DOUBLE if uncorrected else ECC_SINGLE, 0, None)

    def _event(self, gpu: str, kind: int, data: int, gi: int | None) -> None:
        # NVML delivers an event only to the sets the device is registered in, with that type.
        for es in self.event_sets:
            if not es.freed and es.registered.get(gpu, 0) & kind:
                es.queue.append((gpu, kind, data, NO_ID if gi is None else gi))

    # -- mutations -------------------------------------------------------------------------

    def set_mig_mode(self, g: FakeGpu, enabled: bool) -> int:
        """``nvmlDeviceSetMigMode``: the activation status (nvml.h ~L12748)."""
        if not g.mig_capable:
            raise NvmlFailure(NOT_SUPPORTED, "not MIG capable")
        self._privileged()
        self.mutations.append(f"SetMigMode {g.uuid} {int(enabled)}")
        if not enabled and g.gis:
            return IN_USE
        if g.mig_current == enabled:
            g.mig_pending = enabled
            return SUCCESS
        if g.family == "ampere":
            # A100/A30 switch through a GPU reset; with another client on the GPU the change
            # stays pending (gpu-operator#118: "pending ... In use by another client").
            g.mig_pending = enabled
            if g.procs or g.holders:
                return IN_USE
        elif g.procs:
            return IN_USE
        g.mig_current = g.mig_pending = enabled
        return SUCCESS

    def _privileged(self) -> None:
        # nvml.h: MIG management "Requires privileged user" (or the mig/config capability).
        if not self.root:
            raise NvmlFailure(NO_PERMISSION, "not root")

    def create_gi(self, g: FakeGpu, profile_id: int, start: int) -> FakeGi:
        self._privileged()
        if not g.mig_current:
            raise NvmlFailure(NOT_SUPPORTED, "MIG mode is disabled")
        profile = next((p for p in g.profiles if p.id == profile_id), None)
        if profile is None or (start, profile.memory_slices) not in profile.placements:
            raise NvmlFailure(INVALID_ARGUMENT, f"profile {profile_id} at {start}")
        self._fits(g, profile, start)
        self.mutations.append(f"CreateGpuInstance {g.uuid} {profile_id}@{start}")
        gi_id = min(set(range(1, len(g.gis) + 2)) - set(g.gis))
        g.gis[gi_id] = FakeGi(gi_id, profile, start, serial=next(self._ids))
        return g.gis[gi_id]

    @staticmethod
    def _fits(g: FakeGpu, profile: GiProfile, start: int) -> None:
        end = start + profile.memory_slices
        same = [gi for gi in g.gis.values() if gi.profile.id == profile.id]
        used = sum(gi.profile.slices for gi in g.gis.values())
        overlap = any(
            start < gi.start + gi.profile.memory_slices and gi.start < end for gi in g.gis.values()
        )
        if (
            overlap
            or len(same) >= profile.instance_count
            or used + profile.slices > g.compute_slices
        ):
            raise NvmlFailure(INSUFFICIENT_RESOURCES, "does not fit")

    def create_ci(self, g: FakeGpu, gi: FakeGi, ci_profile_id: int) -> FakeCi:
        self._privileged()
        profile = next((p for p in self.ci_profiles(g, gi.profile) if p.id == ci_profile_id), None)
        if profile is None:
            raise NvmlFailure(NOT_SUPPORTED, f"CI profile {ci_profile_id}")
        used = sum(ci.profile.slices for ci in gi.cis.values())
        if used + profile.slices > gi.profile.slices:
            raise NvmlFailure(INSUFFICIENT_RESOURCES, "no compute slices left in the GI")
        self.mutations.append(f"CreateComputeInstance {g.uuid} {gi.id} {ci_profile_id}")
        ci_id = min(set(range(len(gi.cis) + 1)) - set(gi.cis))
        mig_uuid = "MIG-" + _uuid(self.seed, g.uuid, gi.id, ci_id, next(self._ids))
        gi.cis[ci_id] = FakeCi(ci_id, profile, used, mig_uuid)
        return gi.cis[ci_id]

    def destroy_ci(self, g: FakeGpu, gi: FakeGi, ci: FakeCi) -> None:
        self._privileged()
        if any(p.gi == gi.id and p.ci == ci.id for p in g.procs.values()):
            raise NvmlFailure(IN_USE, "processes run on the compute instance")
        self.mutations.append(f"DestroyComputeInstance {g.uuid} {gi.id} {ci.id}")
        del gi.cis[ci.id]

    def destroy_gi(self, g: FakeGpu, gi: FakeGi) -> None:
        self._privileged()
        if gi.cis or any(p.gi == gi.id for p in g.procs.values()):
            raise NvmlFailure(IN_USE, "processes or compute instances on the GPU instance")
        self.mutations.append(f"DestroyGpuInstance {g.uuid} {gi.id}")
        del g.gis[gi.id]

    def set_compute_mode(self, g: FakeGpu, mode: int) -> None:
        self._privileged()
        if g.mig_current and mode != 0:
            # facts §2: "EXCLUSIVE_PROCESS … is not supported when the GPU is in MIG mode".
            raise NvmlFailure(NOT_SUPPORTED, "compute mode under MIG")
        self.mutations.append(f"SetComputeMode {g.uuid} {mode}")
        g.compute_mode = mode

    # -- nvidia-smi ------------------------------------------------------------------------

    def nvidia_smi(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        """``nvidia-smi -r -i <uuid>`` as a ``subprocess.run`` stand-in.

        The reset fails while any NVML client holds the GPU, this process's own NVML session
        included, like nvidia-smi's "in use by another process" (texts are [verify]).
        """
        self.mutations.append(" ".join(argv))
        if argv[1:3] != ["-r", "-i"] or len(argv) != 4:
            return subprocess.CompletedProcess(argv, 2, "", "Invalid combination of input\n")
        g = next((g for g in self.gpus if argv[3] in (g.uuid, str(g.index), g.bus_id)), None)
        if g is None:
            return subprocess.CompletedProcess(argv, 6, "", f"No devices were found ({argv[3]})\n")
        if self.initialised or g.holders or g.procs:
            out = (
                f"GPU {g.bus_id} is currently in use by another process.\n\n1 device is "
                "currently being used by one or more other processes (e.g., Fabric Manager, "
                "CUDA application, graphics application such as an X server, or a monitoring "
                "application such as another instance of nvidia-smi).\n"
            )
            return subprocess.CompletedProcess(argv, 255, out, "")
        g.mig_current = g.mig_pending
        g.gis.clear()
        g.compute_mode = 0  # not persistent (nvml.h)
        g.lost_code = None
        for es in self.event_sets:
            es.registered.pop(g.uuid, None)
        return subprocess.CompletedProcess(argv, 0, f"GPU {g.bus_id} was successfully reset.\n", "")

    # -- probe replay ----------------------------------------------------------------------

    @classmethod
    def from_probe(cls, record: dict[str, Any], *, root: bool | None = None) -> FakeHardware:
        """A fake that answers like the host a ``fleet-agent --probe --json`` record came from
        (``root`` defaults to what the record shows: no NO_PERMISSION on placements)."""
        from tests.hostagent.probe_replay import driver_of, load_gpu, privileged

        hw = cls(driver_of(record), gpus=[], root=privileged(record) if root is None else root)
        hw.gpus = [load_gpu(hw, i, g) for i, g in enumerate(record["gpus"])]
        return hw

    def new_serial(self) -> int:
        return next(self._ids)

    def new_pid(self, pid: int) -> None:
        self._next_pid = max(self._next_pid, pid + 1)

    # -- GPM -------------------------------------------------------------------------------

    def gpm_alloc(self) -> GpmSample:
        sample = GpmSample(next(self._ids))
        self.gpm_live[sample.id] = sample
        return sample

    def gi_util(self, g: FakeGpu, gi_id: int) -> float:
        busy = sum(p.compute_percent for p in g.procs.values() if p.gi == gi_id)
        return float(min(100, busy))

    def gpu_util(self, g: FakeGpu) -> int:
        return min(100, sum(p.compute_percent for p in g.procs.values()))


def real_error(exc: NvmlFailure) -> Exception:
    """The ``pynvml.NVMLError`` subclass for a failure (``NVMLError(code)`` picks it)."""
    return real.NVMLError(exc.code)
