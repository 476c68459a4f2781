"""The simulator's in-memory GPUs, its workloads and the driver behaviours it can reproduce."""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Literal

from hostagent.mps import MpsLimits
from hostagent.protocol import SimulatedGpuSpec, SimulatedProfileSpec

AMPERE_MARKERS = ("A100", "A30")
BASELINE_MEMORY_MIB = 0

ComputeMode = Literal["default", "exclusive_process"]


def new_uuid(seed: int, *parts: object) -> str:
    """A UUID derived from ``seed`` and ``parts`` (deterministic)."""
    digest = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return str(uuidlib.UUID(bytes=digest[:16], version=4))


def is_ampere(name: str) -> bool:
    """Ampere MIG GPUs (A100, A30): no per-instance utilisation in NVML (no GPM), and a MIG mode
    change needs a GPU reset (MIG user guide; review D3)."""
    return any(marker in name for marker in AMPERE_MARKERS)


@dataclass(frozen=True)
class DriverQuirks:
    """Hardware behaviours the simulator reproduces on request; all off is an idealised driver
    (what the control-plane tests were written against).

    Attributes:
        ampere_mig_reset: on A100/A30 a MIG mode change stays pending until ``reset_gpu``, as
            on a host where nvidia-persistenced, DCGM or the agent itself holds the GPU
            (``nvmlDeviceSetMigMode`` activation status IN_USE; review D3). Hopper and later
            switch at once.
        hide_profiles_while_mig_off: ``possible_placements`` is ``[]`` while MIG is off, as
            ``nvmlDeviceGetGpuInstanceProfileInfoV`` answers NOT_SUPPORTED on R535-era drivers
            (mig-parted ``discovery.go``; review D2).
        nvml_holders: the clients a pending MIG change names as holding the GPU.
    """

    ampere_mig_reset: bool = False
    hide_profiles_while_mig_off: bool = False
    nvml_holders: tuple[str, ...] = ("nvidia-persistenced",)

    @classmethod
    def like_hardware(cls) -> DriverQuirks:
        """Every behaviour on: an R535-era driver on a host with persistence mode."""
        return cls(ampere_mig_reset=True, hide_profiles_while_mig_off=True)


@dataclass(frozen=True)
class RunningAllocation:
    """A workload the simulator should run: on a MIG instance or on the whole GPU."""

    key: str
    gpu_instance_id: int | None
    memory_mib: int
    compute_percent: int = 100


@dataclass
class Process:
    """A fake CUDA process; ``mps_server`` is the server it connected to as an MPS client,
    ``mps_limits`` what that server let it have (its limits as it connected, lowered by its
    environment)."""

    pid: int
    memory_mib: int
    compute_percent: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    key: str | None
    mps_target: str | None = None
    mps_server: int | None = None
    mps_limits: MpsLimits | None = None


@dataclass
class GpuInstance:
    """A GPU instance and its compute instances (CI id → MIG UUID)."""

    gpu_instance_id: int
    profile: SimulatedProfileSpec
    start: int
    compute_instances: dict[int, str] = field(default_factory=dict)


@dataclass
class Gpu:
    """One simulated GPU and everything on it."""

    index: int
    uuid: str
    spec: SimulatedGpuSpec
    mig_current: bool = False
    mig_pending: bool = False
    lost: bool = False
    compute_mode: ComputeMode = "default"
    instances: dict[int, GpuInstance] = field(default_factory=dict)
    processes: dict[int, Process] = field(default_factory=dict)
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    ticks: int = 0
    created: int = 0
    events_registered: bool = True
    registration_failures: int = 0
    events_lost: int = 0

    def targets(self) -> list[tuple[str, int | None, int | None]]:
        """MPS targets on this GPU: ``(uuid, gi, ci)`` for the GPU and each compute instance."""
        out: list[tuple[str, int | None, int | None]] = [(self.uuid, None, None)]
        for gi in sorted(self.instances.values(), key=lambda i: i.start):
            for ci_id, mig_uuid in sorted(gi.compute_instances.items()):
                out.append((mig_uuid, gi.gpu_instance_id, ci_id))
        return out
