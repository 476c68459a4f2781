"""The messages of the agent ↔ control-plane protocol, with their bounds (see
:mod:`hostagent.protocol` for the conventions and the transport)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypedDict

from msgspec import Meta

from hostagent.protocol.bounds import (
    MAX_GPUS_HARD,
    MAX_ITEMS,
    MAX_MIG_INSTANCES,
    MAX_PLACEMENTS_PER_PROFILE,
    MAX_PROCESSES,
    MAX_PROFILES,
    U32,
    Celsius,
    Counter,
    Generation,
    GpuIndex,
    InstanceCount,
    InstanceId,
    MiB,
    Milliwatts,
    Percent,
    PlacementPair,
    ProfileId,
    ProfileKey,
    SliceCount,
    SliceIndex,
    SliceSize,
    Text,
    Timestamp,
    Utilization,
    Uuid,
    UuidOrEmpty,
)
from hostagent.protocol.logs import Logs, LogsRequest
from hostagent.protocol.metrics import ReplicaMetrics, Scrape
from hostagent.protocol.workloads import (
    MAX_ENV,
    AgentRuntime,
    EnvName,
    Security,
    Workload,
    WorkloadStatus,
)

PROTOCOL_VERSION = 2
"""Bumped on any change of the messages below that an older peer cannot handle (removing or
retyping a field, a new meaning). History (agent release: protocol):

* 0.1.0: 1.
* 0.2.0: 2. The server checks the hello's ``protocol`` (:func:`protocol_support`) and closes an
  agent it cannot serve with :data:`CLOSE_UNSUPPORTED_PROTOCOL` after an ``error`` saying why;
  nothing else changed, so a protocol-1 agent is served as before.

Optional fields added since, which an older peer drops unread (no new protocol):
``desired_state`` allocations' ``scrape`` and ``telemetry``'s ``replica_metrics`` (a replica's
own Prometheus metrics, :mod:`hostagent.protocol.metrics`).
"""

OLDEST_PROTOCOL = PROTOCOL_VERSION - 1
"""The oldest agent protocol a server accepts: one version behind its own. A fleet is never
upgraded in one instant (the server first, then the hosts, in waves), as a Kubernetes kubelet
may be behind its API server; an agent two versions behind is refused, and so is one newer than
the server (upgrade the server first)."""

AGENT_RELEASES: dict[str, int] = {"0.1.0": 1, "0.2.0": 2}
"""Agent release -> the protocol it speaks: what ``manage.py fleet_upgrade_check`` reads off a
host's ``agent_version`` when the host has not said its protocol yet."""

ProtocolSupport = Literal["supported", "too_old", "too_new"]


def protocol_support(agent: int, server: int = PROTOCOL_VERSION) -> ProtocolSupport:
    """Whether a server speaking ``server`` serves an agent speaking ``agent``."""
    if agent > server:
        return "too_new"
    return "supported" if agent >= server - 1 else "too_old"


WS_PATH = "/ws/agent/"
ENROLL_PATH = "/api/v1/agent/enroll"
DESIRED_STATE_PATH = "/api/v1/agent/desired-state"
REPORT_PATH = "/api/v1/agent/report"
AUTH_HEADER = "Authorization"
AUTH_SCHEME = "Token"


def auth_header_value(token: str) -> str:
    """Return the ``Authorization`` header value for a host token (``"Token <token>"``)."""
    return f"{AUTH_SCHEME} {token}"


GpuStatus = Literal["ok", "lost", "unavailable"]
"""``ok``: NVML answers; ``lost``: NVML says GPU_IS_LOST for this GPU; ``unavailable``: no NVML."""
EventKind = Literal[
    "xid", "ecc", "mps_down", "mps_up", "gpu_lost", "gpu_back", "crashloop", "orphan_stopped"
]
"""``crashloop``: a replica's workload failed too often (``detail`` says which);
``orphan_stopped``: the agent stopped a workload labelled for an allocation it was not given."""
AckStatus = Literal["applied", "partial", "failed"]
ItemStatus = Literal["ok", "in_use", "failed", "refused", "needs_reset"]
SharingMode = Literal["dedicated", "mig", "mps"]
BackendKind = Literal["nvml", "simulated"]

# --------------------------------------------------------------------------------------------
# Shared parts
# --------------------------------------------------------------------------------------------


class PlacementProfile(TypedDict):
    """One GPU-instance profile with the placements NVML allows for it.

    From ``nvmlDeviceGetGpuInstanceProfileInfo`` (``id``, ``sliceCount``, ``memorySizeMB``,
    ``instanceCount``, ``name``) and ``nvmlDeviceGetGpuInstancePossiblePlacements_v2``
    (``nvidia-smi mig -lgip`` / ``-lgipp``).
    """

    profile_id: ProfileId
    name: Text
    compute_slices: SliceCount
    memory_slices: SliceCount
    memory_mib: MiB
    max_instances: InstanceCount
    placements: Annotated[list[PlacementPair], Meta(max_length=MAX_PLACEMENTS_PER_PROFILE)]


class MigInstanceInfo(TypedDict):
    """One MIG GPU instance (and its compute instance, when it has one).

    ``compute_instance_id`` and ``uuid`` (the ``MIG-…`` device UUID) are ``None`` for a GPU
    instance without a compute instance. ``nvidia-smi mig -lgi`` / ``-lci``.
    """

    gpu_instance_id: InstanceId
    compute_instance_id: InstanceId | None
    profile_id: ProfileId
    start: SliceIndex
    size: SliceSize
    uuid: Uuid | None
    memory_mib: MiB | None


class MpsDaemonInfo(TypedDict):
    """State of one MPS control daemon (for a GPU or for one MIG instance)."""

    target_uuid: Uuid
    running: bool
    healthy: bool
    pipe_directory: Text | None
    default_active_thread_percentage: Percent | None
    default_pinned_mem_limit_mib: MiB | None


class MpsState(TypedDict):
    """MPS on one GPU: the daemon for the whole GPU plus one per MIG instance (``instances``)."""

    running: bool
    healthy: bool
    pipe_directory: Text | None
    default_active_thread_percentage: Percent | None
    default_pinned_mem_limit_mib: MiB | None
    instances: Annotated[list[MpsDaemonInfo], Meta(max_length=MAX_MIG_INSTANCES)]


class GpuInfo(TypedDict):
    """Discovery data for one GPU, sent in ``hello`` and in ``ack.observed``.

    ``pci_device_id`` is NVML's combined 32-bit value (``nvmlDeviceGetPciInfo().pciDeviceId``,
    device << 16 | 0x10DE, e.g. ``0x233010DE``). ``mig_mode_current``/``_pending`` come from
    ``nvmlDeviceGetMigMode`` and are ``None`` when the GPU is not MIG capable.
    """

    index: GpuIndex
    uuid: Uuid
    name: Text
    pci_device_id: U32
    memory_total_mib: MiB
    mig_capable: bool
    mig_mode_current: bool | None
    mig_mode_pending: bool | None
    status: GpuStatus
    possible_placements: Annotated[
        dict[ProfileKey, PlacementProfile], Meta(max_length=MAX_PROFILES)
    ]
    mig_instances: Annotated[list[MigInstanceInfo], Meta(max_length=MAX_MIG_INSTANCES)]
    mps: MpsState


ProcessKind = Literal["compute", "mps_server", "mps_client"]


class _ProcessInfoOptional(TypedDict, total=False):
    # Absent from agents before it: "compute". ``mps_server`` is MPS itself, not a workload;
    # ``mps_client`` runs through MPS (nvmlDeviceGetMPSComputeRunningProcesses).
    kind: ProcessKind
    # The replica whose workload this process belongs to (by container PID namespace or by
    # process group), when the agent runs it.
    allocation_id: Annotated[int, Meta(ge=1, le=2**63 - 1)]


class ProcessInfo(_ProcessInfoOptional):
    """A process on a GPU (``nvmlDeviceGetComputeRunningProcesses``, and MPS clients from
    ``nvmlDeviceGetMPSComputeRunningProcesses``)."""

    pid: U32
    used_memory_mib: MiB | None
    gpu_instance_id: InstanceId | None
    compute_instance_id: InstanceId | None


class MigTelemetry(TypedDict):
    """Telemetry for one MIG instance; utilisation from GPM on Hopper+, else ``None``."""

    gpu_instance_id: InstanceId
    compute_instance_id: InstanceId | None
    uuid: Uuid | None
    utilization_percent: Utilization | None
    memory_used_mib: MiB | None
    memory_total_mib: MiB | None


class GpuTelemetry(TypedDict):
    """One telemetry sample of one GPU (``nvidia-smi --query-gpu=…`` equivalent)."""

    uuid: Uuid
    status: GpuStatus
    utilization_gpu_percent: Utilization | None
    memory_used_mib: MiB | None
    memory_total_mib: MiB | None
    temperature_c: Celsius | None
    power_mw: Milliwatts | None
    ecc_corrected: Counter | None
    ecc_uncorrected: Counter | None
    processes: Annotated[list[ProcessInfo], Meta(max_length=MAX_PROCESSES)]
    mig: Annotated[list[MigTelemetry], Meta(max_length=MAX_MIG_INSTANCES)]


class ItemResult(TypedDict):
    """Outcome of one item of a desired state.

    ``key`` is the desired instance/allocation key when the item came from one, otherwise a
    generated key (``"<gpu uuid>:mig_mode"``, ``"<gpu uuid>:gi:<profile_id>@<start>"``,
    ``"<target uuid>:mps"``). ``pids`` lists the processes that blocked an ``in_use`` item.
    ``message`` is ``"mutation_disabled"`` for items ``refused`` because the agent runs without
    ``--allow-mutation``.
    """

    key: Text
    gpu_uuid: UuidOrEmpty
    status: ItemStatus
    message: Text
    pids: Annotated[list[U32], Meta(max_length=MAX_PROCESSES)]


# --------------------------------------------------------------------------------------------
# Up: agent -> server
# --------------------------------------------------------------------------------------------


class _HelloOptional(TypedDict, total=False):
    # Absent from agents that run no workloads: "none".
    runtime: AgentRuntime
    # Whether the agent runs process workloads (started with --allow-process-runtime); absent:
    # it does not.
    process_runtime: bool
    # The address other machines reach this host's published ports at (--address); absent:
    # the agent did not say (the control plane then shows none).
    address: Annotated[str, Meta(pattern=r"^[A-Za-z0-9._:\[\]-]{1,253}$")]


class Hello(_HelloOptional):
    """First message on every connection (and in every REST report batch)."""

    type: Literal["hello"]
    protocol: Annotated[int, Meta(ge=0, le=1_000_000)]
    agent_version: Text
    hostname: Text
    backend: BackendKind
    allow_mutation: bool
    driver_version: Text | None
    nvml_version: Text | None
    applied_generation: Generation
    gpus: Annotated[list[GpuInfo], Meta(max_length=MAX_GPUS_HARD)]


class _TelemetryOptional(TypedDict, total=False):
    # The latest readings of the replicas' own metrics that the server asked for (``scrape``
    # of a desired allocation: hostagent.protocol.metrics); absent from older agents.
    replica_metrics: ReplicaMetrics


class Telemetry(_TelemetryOptional):
    """One tick of telemetry for every GPU of the host."""

    type: Literal["telemetry"]
    ts: Timestamp
    gpus: Annotated[list[GpuTelemetry], Meta(max_length=MAX_GPUS_HARD)]


class Event(TypedDict):
    """A health event. ``xid`` is set for ``kind == "xid"`` (999 = unknown, as NVML says)."""

    type: Literal["event"]
    kind: EventKind
    gpu_uuid: UuidOrEmpty
    gpu_instance_id: InstanceId | None
    xid: U32 | None
    detail: Text
    ts: Timestamp


class Ack(TypedDict):
    """Answer to one ``desired_state``; ``observed`` is the ``hello.gpus`` part after applying."""

    type: Literal["ack"]
    generation: Generation
    status: AckStatus
    items: Annotated[list[ItemResult], Meta(max_length=MAX_ITEMS)]
    observed: Annotated[list[GpuInfo], Meta(max_length=MAX_GPUS_HARD)]


class WorkloadReport(TypedDict):
    """The state of the replicas' workloads: on every change (``full`` false: only those that
    changed), and every replica the agent was given after each connection (``full`` true)."""

    type: Literal["workloads"]
    ts: Timestamp
    full: bool
    workloads: Annotated[list[WorkloadStatus], Meta(max_length=MAX_ITEMS)]


class Pong(TypedDict):
    """Answer to ``ping``; echoes ``nonce``."""

    type: Literal["pong"]
    nonce: Text
    ts: Timestamp


# --------------------------------------------------------------------------------------------
# Down: server -> agent
# --------------------------------------------------------------------------------------------


class _DesiredInstanceOptional(TypedDict, total=False):
    # MPS inside this instance; when absent, the GPU's ``mps`` (with ``per_instance``) applies.
    mps: DesiredMps


class DesiredInstance(_DesiredInstanceOptional):
    """A MIG GPU instance to exist: identified on the GPU by ``(profile_id, start)``."""

    key: Text
    profile_id: ProfileId
    start: SliceIndex


class DesiredMps(TypedDict):
    """MPS settings for a GPU. ``per_instance``: one daemon per MIG instance, not per GPU."""

    enabled: bool
    per_instance: bool
    default_active_thread_percentage: Percent | None
    default_pinned_mem_limit_mib: MiB | None


MAX_DRAIN_S = 300


class _DesiredAllocationOptional(TypedDict, total=False):
    # Absent from servers before workloads: nothing to run.
    allocation_id: Annotated[int, Meta(ge=1, le=2**63 - 1)]
    deployment: Text
    replica: Annotated[int, Meta(ge=0, le=65535)]
    workload: Workload
    # A replica of several whole GPUs runs one workload that sees them all: its first GPU's
    # allocation carries the workload and ``devices``, every GPU of the replica in slot order
    # (on this host); the other GPUs' allocations run nothing (runtime ``none``).
    devices: Annotated[list[Uuid], Meta(min_length=2, max_length=MAX_GPUS_HARD)]
    # How the workload is confined (the team's policy, applied); absent: the restricted defaults.
    security: Security
    # The names in ``workload.env`` whose values are team secrets: the agent keeps them in
    # memory only and masks their values in the replica's logs.
    secret_env: Annotated[list[EnvName], Meta(max_length=MAX_ENV)]
    # Seconds the replica stays up after it is no longer wanted (or before it is restarted
    # with a new spec), reported ``stopping``, before it is sent SIGTERM: its endpoint's
    # balancers take it out of rotation first and its requests in flight finish (an ECS
    # target group's deregistration delay). Absent: 0, stopped at once.
    drain_s: Annotated[int, Meta(ge=0, le=MAX_DRAIN_S)]
    # The replica's own Prometheus metrics an autoscaling policy tracks: the agent reads them
    # and reports them in its telemetry (hostagent.protocol.metrics). Absent: none.
    scrape: Scrape


class DesiredAllocation(_DesiredAllocationOptional):
    """One replica bound to a partition (``partition_key`` = a desired instance key) or to the
    whole GPU (``partition_key`` is ``None``), with its MPS limits when shared by MPS, and the
    workload it runs (:mod:`hostagent.protocol.workloads`)."""

    key: Text
    gpu_uuid: Uuid
    partition_key: Text | None
    memory_mib: MiB | None
    max_compute_percent: Percent | None


class DesiredGpu(TypedDict):
    """The whole desired configuration of one GPU."""

    mode: SharingMode
    mig_enabled: bool
    instances: Annotated[list[DesiredInstance], Meta(max_length=MAX_MIG_INSTANCES)]
    mps: DesiredMps
    allocations: Annotated[list[DesiredAllocation], Meta(max_length=MAX_ITEMS)]


class DesiredState(TypedDict):
    """Generation ``generation`` of the host's desired state, keyed by GPU UUID.

    GPUs absent from ``gpus`` are left as they are.
    """

    type: Literal["desired_state"]
    generation: Generation
    gpus: Annotated[dict[Uuid, DesiredGpu], Meta(max_length=MAX_GPUS_HARD)]


class Ping(TypedDict):
    """Liveness probe; the agent answers with ``pong`` carrying the same ``nonce``."""

    type: Literal["ping"]
    nonce: Text


ErrorCode = Literal[
    "protocol.not_json", "protocol.invalid", "protocol.rate_limited", "protocol.stale_ts"
]


class ServerError(TypedDict):
    """The server refused one of the agent's messages (it changed nothing). ``code`` says why
    (:data:`ErrorCode`; unknown codes may be added), ``message`` explains; ``refused`` is the
    refused message's ``type`` when it had a readable one."""

    type: Literal["error"]
    code: Text
    message: Text
    refused: Text | None


class Pace(TypedDict):
    """The server is past its capacity: report telemetry every ``interval_s`` seconds (never
    faster than the agent's own interval) until a new ``pace`` says otherwise. Heartbeats ride
    on telemetry, so ``interval_s`` stays well under the server's offline limit."""

    type: Literal["pace"]
    interval_s: Annotated[float, Meta(ge=0.1, le=60.0)]
    reason: Text


class RetryLater(TypedDict):
    """Sent just before the server closes a new socket with :data:`CLOSE_RETRY_LATER`: it cannot
    admit the agent now; connect again after ``after_s`` seconds (plus jitter)."""

    type: Literal["retry_later"]
    after_s: Annotated[float, Meta(ge=0.0, le=600.0)]
    reason: Text


class HostToken(TypedDict):
    """The host's renewed token (sent before the current one expires): the agent stores it in
    its state file and uses it from the next connection on; the old one stops working once the
    new one has been used, or at ``expires_at`` of the old one at the latest."""

    type: Literal["host_token"]
    token: Annotated[str, Meta(min_length=16, max_length=256)]
    expires_at: Timestamp


UpMessage = Hello | Telemetry | Event | Ack | Pong | WorkloadReport | Logs
DownMessage = DesiredState | Ping | ServerError | LogsRequest | Pace | RetryLater | HostToken
Message = UpMessage | DownMessage

# --------------------------------------------------------------------------------------------
# REST bodies and the simulated-GPU spec
# --------------------------------------------------------------------------------------------


class ReportBatch(TypedDict):
    """Body of ``POST /api/v1/agent/report``: up-messages in the order they happened."""

    messages: list[UpMessage]


class EnrollRequest(TypedDict):
    """Body of ``POST /api/v1/agent/enroll``."""

    enrollment_token: Text
    hostname: Text


class EnrollResponse(TypedDict):
    """Answer of ``POST /api/v1/agent/enroll``: the per-host token to use from now on."""

    host_id: Annotated[int, Meta(ge=1)]
    token: Text


class SimulatedProfileSpec(TypedDict):
    """One MIG profile of a simulated GPU, as the control plane's catalog knows it."""

    id: int
    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    max_instances: int
    placements: list[list[int]]


class _SimulatedGpuSpecOptional(TypedDict, total=False):
    uuid: str


class SimulatedGpuSpec(_SimulatedGpuSpecOptional):
    """A simulated GPU; the control plane generates these from its MIG catalog.

    ``profiles`` is empty when ``mig_capable`` is false. ``uuid`` (optional) fixes the GPU's
    UUID; otherwise it derives from the backend's seed and the GPU's index.
    """

    name: str
    pci_device_id: int
    memory_mib: int
    mig_capable: bool
    compute_slice_count: int
    memory_slice_count: int
    profiles: list[SimulatedProfileSpec]


# --------------------------------------------------------------------------------------------
# WebSocket close codes, the message registry and small helpers
# --------------------------------------------------------------------------------------------

CLOSE_REPLACED = 4409
"""WebSocket close code: another socket of the same host replaced this one."""
CLOSE_REVOKED = 4401
"""WebSocket close code: the host token is not (or no longer) valid."""
CLOSE_ABUSE = 4429
"""WebSocket close code: the agent kept sending refused or too many messages."""
CLOSE_UNSUPPORTED_PROTOCOL = 4426
"""WebSocket close code (as HTTP 426 Upgrade Required): the server does not serve this agent's
protocol (:func:`protocol_support`); an ``error`` sent just before says which versions it does.
The agent logs it and tries again rarely (:data:`UNSUPPORTED_RETRY_S`): it will not get better
until one side is upgraded."""
UNSUPPORTED_RETRY_S = 300.0
CLOSE_RETRY_LATER = 4503
"""WebSocket close code: the server is past its capacity and did not admit the socket; a
``retry_later`` message sent just before says when to come back."""


MESSAGE_TYPES: dict[str, type[Any]] = {
    "hello": Hello,
    "telemetry": Telemetry,
    "event": Event,
    "ack": Ack,
    "pong": Pong,
    "workloads": WorkloadReport,
    "logs": Logs,
    "desired_state": DesiredState,
    "ping": Ping,
    "error": ServerError,
    "logs_request": LogsRequest,
    "pace": Pace,
    "retry_later": RetryLater,
    "host_token": HostToken,
}
DOWN_TYPES = frozenset(
    {"desired_state", "ping", "error", "logs_request", "pace", "retry_later", "host_token"}
)
"""The message types only the server sends."""


def ack_status(items: list[ItemResult]) -> AckStatus:
    """Summarise item results: all ``ok`` → applied, none ``ok`` (and some items) → failed."""
    if all(item["status"] == "ok" for item in items):
        return "applied"
    if any(item["status"] == "ok" for item in items):
        return "partial"
    return "failed"


def empty_mps_state() -> MpsState:
    """The MPS state of a GPU with no daemon."""
    return {
        "running": False,
        "healthy": False,
        "pipe_directory": None,
        "default_active_thread_percentage": None,
        "default_pinned_mem_limit_mib": None,
        "instances": [],
    }
