"""The versioned wire contract between the host agent and the Fleet control plane.

This module is **stdlib only** and is the one agent module the control plane imports
(``from hostagent import protocol``). Everything that crosses the wire is a JSON object with a
``"type"`` key; the TypedDicts below describe each message exactly, and :func:`decode` checks an
incoming text against them (required keys, JSON types, ``Literal`` values) and raises
:class:`ProtocolError` on anything malformed. Extra keys are accepted and kept, so a newer peer
can add optional fields without breaking an older one; removing or retyping a field needs a new
:data:`PROTOCOL_VERSION`.

Conventions:

* Units are in the field names (``memory_mib``, ``power_mw``, ``temperature_c``).
* ``None`` (JSON ``null``) means "NVML has no value here" (for example utilisation of a MIG
  instance on Ampere, or ECC counters on a GPU without ECC). It never means zero.
* Timestamps (``ts``) are Unix seconds as floats, taken on the agent.
* JSON object keys are strings: ``possible_placements`` is keyed by ``str(profile_id)`` and each
  value repeats ``profile_id`` as an int.
* A MIG placement is ``[start, size]`` in memory slices, exactly as
  ``nvmlDeviceGetGpuInstancePossiblePlacements_v2`` / ``nvidia-smi mig -lgipp`` report it.

Messages, agent → server (``UpMessage``): ``hello``, ``telemetry``, ``event``, ``ack``, ``pong``.
Messages, server → agent (``DownMessage``): ``desired_state``, ``ping``.

Transport (paths relative to the server base URL, see the ``*_PATH`` constants):

* WebSocket ``/ws/agent/`` with header ``Authorization: Token <host token>``. The agent sends
  ``hello`` first, then ``telemetry`` every interval and ``event`` as they happen; the server
  sends ``desired_state`` (on connect when the agent's ``applied_generation`` is behind, and on
  every push); the agent answers each ``desired_state`` with one ``ack``.
* REST fallback (same header): ``GET /api/v1/agent/desired-state`` returns a ``desired_state``
  message (``204 No Content`` when the host has none yet); ``POST /api/v1/agent/report`` takes a
  :class:`ReportBatch` ``{"messages": [...]}`` of up-messages and answers ``200`` with
  ``{"accepted": n}``.
* Enrolment (no auth header): ``POST /api/v1/agent/enroll`` with :class:`EnrollRequest`, answered
  by :class:`EnrollResponse`.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Literal, TypedDict, Union, cast

PROTOCOL_VERSION = 1
"""Bumped on any incompatible change of the messages below."""

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
EventKind = Literal["xid", "ecc", "mps_down", "mps_up", "gpu_lost", "gpu_back"]
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

    profile_id: int
    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    max_instances: int
    placements: list[list[int]]


class MigInstanceInfo(TypedDict):
    """One MIG GPU instance (and its compute instance, when it has one).

    ``compute_instance_id`` and ``uuid`` (the ``MIG-…`` device UUID) are ``None`` for a GPU
    instance without a compute instance. ``nvidia-smi mig -lgi`` / ``-lci``.
    """

    gpu_instance_id: int
    compute_instance_id: int | None
    profile_id: int
    start: int
    size: int
    uuid: str | None
    memory_mib: int | None


class MpsDaemonInfo(TypedDict):
    """State of one MPS control daemon (for a GPU or for one MIG instance)."""

    target_uuid: str
    running: bool
    healthy: bool
    pipe_directory: str | None
    default_active_thread_percentage: int | None
    default_pinned_mem_limit_mib: int | None


class MpsState(TypedDict):
    """MPS on one GPU: the daemon for the whole GPU plus one per MIG instance (``instances``)."""

    running: bool
    healthy: bool
    pipe_directory: str | None
    default_active_thread_percentage: int | None
    default_pinned_mem_limit_mib: int | None
    instances: list[MpsDaemonInfo]


class GpuInfo(TypedDict):
    """Discovery data for one GPU, sent in ``hello`` and in ``ack.observed``.

    ``pci_device_id`` is NVML's combined 32-bit value (``nvmlDeviceGetPciInfo().pciDeviceId``,
    device << 16 | 0x10DE, e.g. ``0x233010DE``). ``mig_mode_current``/``_pending`` come from
    ``nvmlDeviceGetMigMode`` and are ``None`` when the GPU is not MIG capable.
    """

    index: int
    uuid: str
    name: str
    pci_device_id: int
    memory_total_mib: int
    mig_capable: bool
    mig_mode_current: bool | None
    mig_mode_pending: bool | None
    status: GpuStatus
    possible_placements: dict[str, PlacementProfile]
    mig_instances: list[MigInstanceInfo]
    mps: MpsState


class ProcessInfo(TypedDict):
    """A compute process on a GPU (``nvmlDeviceGetComputeRunningProcesses``)."""

    pid: int
    used_memory_mib: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None


class MigTelemetry(TypedDict):
    """Telemetry for one MIG instance; utilisation from GPM on Hopper+, else ``None``."""

    gpu_instance_id: int
    compute_instance_id: int | None
    uuid: str | None
    utilization_percent: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None


class GpuTelemetry(TypedDict):
    """One telemetry sample of one GPU (``nvidia-smi --query-gpu=…`` equivalent)."""

    uuid: str
    status: GpuStatus
    utilization_gpu_percent: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    temperature_c: int | None
    power_mw: int | None
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    processes: list[ProcessInfo]
    mig: list[MigTelemetry]


class ItemResult(TypedDict):
    """Outcome of one item of a desired state.

    ``key`` is the desired instance/allocation key when the item came from one, otherwise a
    generated key (``"<gpu uuid>:mig_mode"``, ``"<gpu uuid>:gi:<profile_id>@<start>"``,
    ``"<target uuid>:mps"``). ``pids`` lists the processes that blocked an ``in_use`` item.
    ``message`` is ``"mutation_disabled"`` for items ``refused`` because the agent runs without
    ``--allow-mutation``.
    """

    key: str
    gpu_uuid: str
    status: ItemStatus
    message: str
    pids: list[int]


# --------------------------------------------------------------------------------------------
# Up: agent -> server
# --------------------------------------------------------------------------------------------


class Hello(TypedDict):
    """First message on every connection (and in every REST report batch)."""

    type: Literal["hello"]
    protocol: int
    agent_version: str
    hostname: str
    backend: BackendKind
    allow_mutation: bool
    driver_version: str | None
    nvml_version: str | None
    applied_generation: int
    gpus: list[GpuInfo]


class Telemetry(TypedDict):
    """One tick of telemetry for every GPU of the host."""

    type: Literal["telemetry"]
    ts: float
    gpus: list[GpuTelemetry]


class Event(TypedDict):
    """A health event. ``xid`` is set for ``kind == "xid"`` (999 = unknown, as NVML says)."""

    type: Literal["event"]
    kind: EventKind
    gpu_uuid: str
    gpu_instance_id: int | None
    xid: int | None
    detail: str
    ts: float


class Ack(TypedDict):
    """Answer to one ``desired_state``; ``observed`` is the ``hello.gpus`` part after applying."""

    type: Literal["ack"]
    generation: int
    status: AckStatus
    items: list[ItemResult]
    observed: list[GpuInfo]


class Pong(TypedDict):
    """Answer to ``ping``; echoes ``nonce``."""

    type: Literal["pong"]
    nonce: str
    ts: float


# --------------------------------------------------------------------------------------------
# Down: server -> agent
# --------------------------------------------------------------------------------------------


class _DesiredInstanceOptional(TypedDict, total=False):
    # MPS inside this instance; when absent, the GPU's ``mps`` (with ``per_instance``) applies.
    mps: DesiredMps


class DesiredInstance(_DesiredInstanceOptional):
    """A MIG GPU instance to exist: identified on the GPU by ``(profile_id, start)``."""

    key: str
    profile_id: int
    start: int


class DesiredMps(TypedDict):
    """MPS settings for a GPU. ``per_instance``: one daemon per MIG instance, not per GPU."""

    enabled: bool
    per_instance: bool
    default_active_thread_percentage: int | None
    default_pinned_mem_limit_mib: int | None


class DesiredAllocation(TypedDict):
    """One replica bound to a partition (``partition_key`` = a desired instance key) or to the
    whole GPU (``partition_key`` is ``None``), with its MPS limits when shared by MPS."""

    key: str
    gpu_uuid: str
    partition_key: str | None
    memory_mib: int | None
    max_compute_percent: int | None


class DesiredGpu(TypedDict):
    """The whole desired configuration of one GPU."""

    mode: SharingMode
    mig_enabled: bool
    instances: list[DesiredInstance]
    mps: DesiredMps
    allocations: list[DesiredAllocation]


class DesiredState(TypedDict):
    """Generation ``generation`` of the host's desired state, keyed by GPU UUID.

    GPUs absent from ``gpus`` are left as they are.
    """

    type: Literal["desired_state"]
    generation: int
    gpus: dict[str, DesiredGpu]


class Ping(TypedDict):
    """Liveness probe; the agent answers with ``pong`` carrying the same ``nonce``."""

    type: Literal["ping"]
    nonce: str


UpMessage = Hello | Telemetry | Event | Ack | Pong
DownMessage = DesiredState | Ping
Message = UpMessage | DownMessage

# --------------------------------------------------------------------------------------------
# REST bodies and the simulated-GPU spec
# --------------------------------------------------------------------------------------------


class ReportBatch(TypedDict):
    """Body of ``POST /api/v1/agent/report``: up-messages in the order they happened."""

    messages: list[UpMessage]


class EnrollRequest(TypedDict):
    """Body of ``POST /api/v1/agent/enroll``."""

    enrollment_token: str
    hostname: str


class EnrollResponse(TypedDict):
    """Answer of ``POST /api/v1/agent/enroll``: the per-host token to use from now on."""

    host_id: int
    token: str


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
# Encoding and validation
# --------------------------------------------------------------------------------------------


class ProtocolError(ValueError):
    """A message that does not follow this contract. ``path`` points at the offending value."""

    def __init__(self, message: str, path: str = "$") -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


MESSAGE_TYPES: dict[str, type[Any]] = {
    "hello": Hello,
    "telemetry": Telemetry,
    "event": Event,
    "ack": Ack,
    "pong": Pong,
    "desired_state": DesiredState,
    "ping": Ping,
}

_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(td: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(td)
    if hints is None:
        hints = typing.get_type_hints(td)
        _HINTS[td] = hints
    return hints


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _check(value: Any, tp: Any, path: str) -> None:
    origin = typing.get_origin(tp)
    if tp is type(None):
        if value is not None:
            raise ProtocolError("expected null", path)
    elif origin in (Union, types.UnionType):
        errors = []
        for arm in typing.get_args(tp):
            try:
                _check(value, arm, path)
            except ProtocolError as exc:
                errors.append(str(exc))
            else:
                return
        raise ProtocolError(f"no alternative matched ({'; '.join(errors)})", path)
    elif origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
            raise ProtocolError(f"expected one of {list(allowed)!r}, got {value!r}", path)
    elif tp is bool:
        if not isinstance(value, bool):
            raise ProtocolError("expected a boolean", path)
    elif tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolError("expected an integer", path)
    elif tp is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ProtocolError("expected a number", path)
    elif tp is str:
        if not isinstance(value, str):
            raise ProtocolError("expected a string", path)
    elif origin is list:
        if not isinstance(value, list):
            raise ProtocolError("expected an array", path)
        (item_tp,) = typing.get_args(tp)
        for i, item in enumerate(value):
            _check(item, item_tp, f"{path}[{i}]")
    elif origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError("expected an object", path)
        _, val_tp = typing.get_args(tp)
        for k, v in value.items():
            if not isinstance(k, str):
                raise ProtocolError("object keys must be strings", path)
            _check(v, val_tp, f"{path}.{k}")
    elif _is_typeddict(tp):
        _check_typeddict(value, tp, path)
    else:  # pragma: no cover - a type this validator does not know is a bug in this module
        raise TypeError(f"unsupported annotation {tp!r}")


def _check_typeddict(value: Any, td: type[Any], path: str) -> None:
    if not isinstance(value, dict):
        raise ProtocolError("expected an object", path)
    hints = _hints(td)
    for key in sorted(td.__required_keys__):
        if key not in value:
            raise ProtocolError(f"missing key {key!r}", path)
    for key, tp in hints.items():
        if key in value:
            _check(value[key], tp, f"{path}.{key}")


# -- compiled predicates: the same rules as :func:`_check`, without paths or messages ----------
#
# Telemetry arrives once a second from every host, so the happy path must be cheap: each type
# is compiled once into a closure that only answers "valid or not". When it says "not", the
# interpreting :func:`_check` runs to say where and why (tests check the two always agree).

_Predicate = typing.Callable[[Any], bool]
_PREDICATES: dict[Any, _Predicate] = {}


def _predicate(tp: Any) -> _Predicate:
    key = tp if isinstance(tp, type) else repr(tp)
    found = _PREDICATES.get(key)
    if found is None:
        found = _compile(tp)
        _PREDICATES[key] = found
    return found


def _compile(tp: Any) -> _Predicate:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return lambda v: v is None
    if origin in (Union, types.UnionType):
        arms = typing.get_args(tp)
        if len(arms) == 2 and type(None) in arms:  # X | None: the common case, kept cheap
            inner = _compile(arms[0] if arms[1] is type(None) else arms[1])
            return lambda v: v is None or inner(v)
        compiled = [_compile(arm) for arm in arms]
        return lambda v: any(check(v) for check in compiled)
    if origin is Literal:
        allowed = typing.get_args(tp)
        is_bool = isinstance(allowed[0], bool)
        return lambda v: v in allowed and isinstance(v, bool) == is_bool
    if tp is bool:
        return lambda v: v.__class__ is bool
    if tp is int:
        return lambda v: isinstance(v, int) and v.__class__ is not bool
    if tp is float:
        return lambda v: isinstance(v, int | float) and v.__class__ is not bool
    if tp is str:
        return lambda v: isinstance(v, str)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        item = _compile(item_tp)
        return lambda v: isinstance(v, list) and all(item(i) for i in v)
    if origin is dict:
        _, val_tp = typing.get_args(tp)
        value = _compile(val_tp)
        return lambda v: (
            isinstance(v, dict) and all(isinstance(k, str) and value(x) for k, x in v.items())
        )
    if _is_typeddict(tp):
        return _PREDICATES.get(tp) or _compile_typeddict(tp)
    raise TypeError(f"unsupported annotation {tp!r}")  # pragma: no cover - a bug here


def _compile_typeddict(td: type[Any]) -> _Predicate:
    required = frozenset(td.__required_keys__)
    fields: list[tuple[str, _Predicate]] = []

    def check(v: Any) -> bool:
        if not isinstance(v, dict) or not required <= v.keys():
            return False
        for key, field in fields:  # noqa: SIM110 - a loop is faster than all() on this path
            if key in v and not field(v[key]):
                return False
        return True

    _PREDICATES[td] = check  # before the fields: a recursive type finds itself
    fields.extend((key, _compile(tp)) for key, tp in _hints(td).items())
    return check


def is_valid(obj: Any, td: type[Any]) -> bool:
    """Whether ``obj`` matches the TypedDict ``td`` (the fast form of :func:`validate`)."""
    return _predicate(td)(obj)


def validate(obj: Any, td: type[Any]) -> None:
    """Check that ``obj`` (parsed JSON) matches the TypedDict ``td``; raise ProtocolError if not.

    Usable for the REST bodies and :class:`SimulatedGpuSpec` as well as for messages.
    """
    if not _predicate(td)(obj):
        _check_typeddict(obj, td, "$")
        raise ProtocolError("invalid", "$")  # pragma: no cover - the two forms disagree: a bug


def validate_message(obj: Any) -> Message:
    """Check a parsed JSON object against the message type named by its ``"type"`` key."""
    if not isinstance(obj, dict):
        raise ProtocolError("a message must be a JSON object")
    kind = obj.get("type")
    td = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if td is None:
        raise ProtocolError(f"unknown message type {kind!r}", "$.type")
    validate(obj, td)
    return cast(Message, obj)


def encode(msg: Message) -> str:
    """Serialise a message to compact JSON text, validating it first (a bug here is ours)."""
    validate_message(msg)
    return json.dumps(msg, separators=(",", ":"), allow_nan=False)


def decode(text: str | bytes) -> Message:
    """Parse and validate one message; raise :class:`ProtocolError` when malformed."""
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from exc
    return validate_message(obj)


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
