"""The ``GpuBackend`` protocol: everything the agent asks of a GPU driver.

Two implementations exist: :mod:`hostagent.gpu.nvml` (the only module importing ``pynvml``) and
:mod:`hostagent.gpu.simulated`. One contract test suite runs against both so they cannot drift.
GPUs are addressed by UUID (``GPU-…``), which survives re-enumeration, unlike the index.

Errors are translated at the boundary into the backend-neutral classes below; no NVML error
class escapes a backend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

from hostagent.protocol import EventKind, GpuStatus

# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------


class BackendError(Exception):
    """Base class of every error a backend raises."""


class GpuUnavailable(BackendError):
    """No driver or no NVML library (NVML LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED)."""


class NotSupported(BackendError):
    """The GPU or driver does not support this call (NVML_ERROR_NOT_SUPPORTED)."""


class InUse(BackendError):
    """Processes run on the partition or GPU (NVML_ERROR_IN_USE); ``pids`` lists them."""

    def __init__(self, message: str, pids: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.pids = pids


class InsufficientResources(BackendError):
    """The instance does not fit: overlap or no capacity (NVML_ERROR_INSUFFICIENT_RESOURCES)."""


class InvalidPlacement(BackendError):
    """Unknown profile or a placement the profile does not allow (NVML_ERROR_INVALID_ARGUMENT)."""


class GpuLost(BackendError):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)."""


class NotFound(BackendError):
    """No such GPU, GPU instance or compute instance (NVML_ERROR_NOT_FOUND)."""


# ------------------------------------------------------------------------------------------------
# Values
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuDevice:
    """One physical GPU as discovered (``nvidia-smi -L`` plus ``-q`` basics)."""

    index: int
    uuid: str
    name: str
    pci_device_id: int
    memory_total_mib: int
    mig_capable: bool
    mig_mode_current: bool | None
    mig_mode_pending: bool | None
    status: GpuStatus = "ok"


@dataclass(frozen=True)
class ProfilePlacements:
    """A GPU-instance profile and its possible ``(start, size)`` placements (``-lgipp``)."""

    profile_id: int
    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    max_instances: int
    placements: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class MigInstance:
    """A GPU instance and (if any) one compute instance in it (``-lgi`` / ``-lci``)."""

    gpu_instance_id: int
    profile_id: int
    start: int
    size: int
    compute_instance_id: int | None = None
    uuid: str | None = None
    memory_mib: int | None = None


ProcessKind = Literal["compute", "mps_server", "mps_client"]
"""``compute``: a process of its own on the GPU; ``mps_server``: ``nvidia-cuda-mps-server``, which
NVML lists among the compute processes (type C) although it is MPS itself, not a workload;
``mps_client``: a process running through MPS (``nvmlDeviceGetMPSComputeRunningProcesses``,
``M+C`` in ``nvidia-smi``)."""


@dataclass(frozen=True)
class ProcessSample:
    """A process on the GPU: compute processes (``nvmlDeviceGetComputeRunningProcesses``) and MPS
    clients (``nvmlDeviceGetMPSComputeRunningProcesses``), told apart by ``kind``."""

    pid: int
    used_memory_mib: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    kind: ProcessKind = "compute"


@dataclass(frozen=True)
class MigSample:
    """Telemetry of one MIG instance; ``utilization_percent`` only where GPM exists."""

    gpu_instance_id: int
    compute_instance_id: int | None
    uuid: str | None
    utilization_percent: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None


@dataclass(frozen=True)
class GpuSample:
    """One telemetry sample of a GPU; ``None`` wherever NVML has no value."""

    uuid: str
    status: GpuStatus
    utilization_gpu_percent: float | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    temperature_c: int | None = None
    power_mw: int | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    processes: tuple[ProcessSample, ...] = ()
    mig: tuple[MigSample, ...] = field(default=())


@dataclass(frozen=True)
class GpuEvent:
    """A health event (Xid, ECC, GPU lost/back, MPS down/up)."""

    kind: EventKind
    gpu_uuid: str
    detail: str
    ts: float
    gpu_instance_id: int | None = None
    xid: int | None = None


class MigModeResult(NamedTuple):
    """Outcome of ``set_mig_mode``: ``ok`` if accepted, ``needs_reset`` if pending a GPU reset.

    ``message`` says why a change is pending, naming what holds the GPU where NVML can tell
    (on A100/A30 any other NVML client does: nvidia-persistenced, DCGM, this agent).
    """

    ok: bool
    needs_reset: bool
    message: str = ""


# ------------------------------------------------------------------------------------------------
# Helpers shared by the backends and the agent (no NVML needed)
# ------------------------------------------------------------------------------------------------

_DRIVER_BRANCH = re.compile(r"^\s*(\d{3,4})(?:\.\d+)*\s*$")
_MIG_PREFIX = re.compile(r"^\s*mig[\s-]+", re.IGNORECASE)


def driver_branch(version: str | None) -> int | None:
    """The driver branch of an ``nvmlSystemGetDriverVersion`` string: ``"535.183.01"`` → 535.

    ``None`` for anything that is not a dotted driver version (a missing or odd answer), so a
    caller enforcing a minimum driver can tell "too old" from "unknown".
    """
    match = _DRIVER_BRANCH.match(version or "")
    return int(match.group(1)) if match else None


def normalize_profile_name(raw: str) -> str:
    """A GPU-instance profile name as ``nvidia-smi mig -lgip`` shows it: ``"MIG 1g.10gb"`` →
    ``"1g.10gb"``.

    ``nvmlGpuInstanceProfileInfo_v2_t.name`` may carry a ``"MIG "`` prefix (review D18; third-party
    NVML code strips it too); the control plane's catalog keys have none.
    """
    return _MIG_PREFIX.sub("", raw).strip()


# ------------------------------------------------------------------------------------------------
# The seam
# ------------------------------------------------------------------------------------------------


class GpuBackend(Protocol):
    """What the agent needs from a GPU driver. ``gpu`` arguments are GPU UUIDs."""

    kind: str

    def init(self) -> None:
        """Initialise the library (``nvmlInit``); raise :class:`GpuUnavailable` without one."""

    def shutdown(self) -> None:
        """Release the library (``nvmlShutdown``); safe to call twice."""

    def available(self) -> bool:
        """True if the library is initialised and GPUs can be queried."""

    def driver_version(self) -> str | None:
        """``nvmlSystemGetDriverVersion``; ``None`` when unavailable."""

    def nvml_version(self) -> str | None:
        """``nvmlSystemGetNVMLVersion``; ``None`` when unavailable."""

    def list_gpus(self) -> list[GpuDevice]:
        """Every GPU; one that does not answer is listed with ``status="lost"`` (or
        ``"unavailable"`` without permission) while the others report."""

    def possible_placements(self, gpu: str) -> list[ProfilePlacements]:
        """Profiles and placements (``nvidia-smi mig -lgipp``); ``[]`` if not MIG capable, and
        ``[]`` while a driver hides them (MIG off on R535-era drivers): ask again after enabling
        MIG. Names are normalised (:func:`normalize_profile_name`)."""

    def mig_instances(self, gpu: str) -> list[MigInstance]:
        """Current GPU and compute instances, ordered by ``start``."""

    def set_mig_mode(self, gpu: str, enabled: bool) -> MigModeResult:
        """``nvmlDeviceSetMigMode``; raise :class:`InUse` with the PIDs if processes run.

        A change left pending (A100/A30: a GPU reset is needed and another NVML client holds
        the GPU) is ``needs_reset=True`` with a ``message`` saying why; see :meth:`reset_gpu`.
        """

    def create_gpu_instance(self, gpu: str, profile_id: int, start: int) -> MigInstance:
        """``nvmlDeviceCreateGpuInstanceWithPlacement`` (``nvidia-smi mig -cgi ID:START``)."""

    def create_compute_instance(self, gpu: str, gpu_instance_id: int) -> MigInstance:
        """Create the default full-size compute instance in a GI (``nvidia-smi mig -cci -gi``)."""

    def destroy_compute_instance(
        self, gpu: str, gpu_instance_id: int, compute_instance_id: int
    ) -> None:
        """``nvmlComputeInstanceDestroy``; raise :class:`InUse` with the PIDs if busy."""

    def destroy_gpu_instance(self, gpu: str, gpu_instance_id: int) -> None:
        """``nvmlGpuInstanceDestroy``; raise :class:`InUse` if processes or CIs remain."""

    def sample(self, gpu: str) -> GpuSample:
        """One telemetry sample; a lost GPU yields ``status="lost"`` rather than an error."""

    def processes(self, gpu: str) -> list[ProcessSample]:
        """Processes on the GPU (all MIG instances included): workloads, the
        ``nvidia-cuda-mps-server`` and MPS clients, told apart by ``kind``, each PID once."""

    def wait_events(self, timeout_ms: int) -> list[GpuEvent]:
        """Wait up to ``timeout_ms`` for health events (``nvmlEventSetWait``); ``[]`` on timeout."""

    def reset_gpu(self, gpu: str) -> None:
        """Reset one GPU (``nvidia-smi -r -i <uuid>``), releasing this backend's own handles on it
        first (an NVML client holding it makes the reset fail); re-discover it afterwards.
        Raise :class:`InUse` when other processes hold it, :class:`BackendError` otherwise."""

    def set_compute_mode(self, gpu: str, exclusive_process: bool) -> None:
        """``nvmlDeviceSetComputeMode``: ``EXCLUSIVE_PROCESS`` for a GPU shared by MPS (NVIDIA's
        recommendation), ``DEFAULT`` otherwise. Not supported in MIG mode (raise
        :class:`NotSupported`)."""

    def probe(self) -> dict[str, Any]:
        """A read-only record of the host for ``fleet-agent --probe --json``: driver and NVML
        versions, supported calls, profiles and placements in the current MIG mode, instances
        with their compute-instance profiles, GPM and event support, process lists. Changes
        nothing."""
