"""What the planner reads (:class:`ObservedGpu`) and the steps it plans (:class:`Action`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hostagent.gpu.backend import MigInstance, ProcessSample, ProfilePlacements
from hostagent.mps import MpsLimits

Slot = tuple[int, int]
"""An instance identity on one GPU: ``(profile_id, start)``."""


@dataclass(frozen=True)
class ObservedGpu:
    """What the agent sees on one GPU.

    ``mps`` maps the running daemons the agent manages (the GPU's and its MIG instances') to
    the limits they read back; ``mps_servers`` / ``mps_clients`` to their server PIDs
    (``get_server_list``) and client PIDs (``get_client_list``).
    """

    uuid: str
    mig_capable: bool
    mig_mode_current: bool | None
    placements: tuple[ProfilePlacements, ...] = ()
    instances: tuple[MigInstance, ...] = ()
    processes: tuple[ProcessSample, ...] = ()
    mps: dict[str, MpsLimits] = field(default_factory=dict)
    mps_servers: dict[str, tuple[int, ...]] = field(default_factory=dict)
    mps_clients: dict[str, tuple[int, ...]] = field(default_factory=dict)
    mig_mode_pending: bool | None = None


@dataclass(frozen=True)
class Action:
    """Base of every planned step; ``key`` names the item in the ack."""

    gpu_uuid: str
    key: str


@dataclass(frozen=True)
class Blocked(Action):
    """Not done because processes run where it would act (reported ``in_use``)."""

    pids: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class Invalid(Action):
    """The desired item cannot exist on this GPU (reported ``failed``)."""

    reason: str


@dataclass(frozen=True)
class Deferred(Action):
    """A desired instance planned only after the MIG mode change: the driver lists no profiles
    while MIG is off (R535-era NOT_SUPPORTED, review D2)."""

    profile_id: int
    start: int


@dataclass(frozen=True)
class StopMps(Action):
    """``echo quit | nvidia-cuda-mps-control`` for one daemon."""

    target_uuid: str


@dataclass(frozen=True)
class DestroyComputeInstance(Action):
    """``nvmlComputeInstanceDestroy`` (``nvidia-smi mig -dci``)."""

    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True)
class DestroyGpuInstance(Action):
    """``nvmlGpuInstanceDestroy`` (``nvidia-smi mig -dgi``)."""

    gpu_instance_id: int


@dataclass(frozen=True)
class SetMigMode(Action):
    """``nvmlDeviceSetMigMode`` (``nvidia-smi -mig 0|1``)."""

    enabled: bool


@dataclass(frozen=True)
class CreateGpuInstance(Action):
    """``nvmlDeviceCreateGpuInstanceWithPlacement`` (``nvidia-smi mig -cgi ID:START``)."""

    profile_id: int
    start: int


@dataclass(frozen=True)
class CreateComputeInstance(Action):
    """Default compute instance in the GI at ``(profile_id, start)`` (``mig -cci``)."""

    profile_id: int
    start: int


@dataclass(frozen=True)
class EnsureMps(Action):
    """Start an MPS daemon (GPU-wide when ``slot`` is None) and put ``limits`` on it (its
    defaults and its running servers); ``note`` says which shares it cannot hold to their own."""

    slot: Slot | None
    limits: MpsLimits
    note: str = ""
