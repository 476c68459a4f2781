"""Parsing and checking protocol messages: :func:`decode` (text, one msgspec pass),
:func:`validate_message` (parsed JSON), :func:`check_message` (the rules a type cannot say) and
:func:`encode`. Each returns a projection (unknown keys dropped) or raises
:class:`ProtocolError`."""

from __future__ import annotations

import itertools
import json
import re
from typing import Annotated, Any, TypedDict, cast

import msgspec
from msgspec import Meta

from hostagent.protocol.bounds import MAX_GPUS_HARD, MAX_GPUS_PER_HOST, MAX_MEMORY_SLICES, clip
from hostagent.protocol.logs import MAX_LOG_BYTES, Logs, log_bytes
from hostagent.protocol.messages import (
    MESSAGE_TYPES,
    Ack,
    DesiredState,
    GpuInfo,
    Hello,
    Message,
    Telemetry,
    WorkloadReport,
)
from hostagent.protocol.workloads import workload_problems

# A JSON ``\u0000`` escape: after an even run of backslashes (each pair is an escaped one).
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class ProtocolError(ValueError):
    """A message that does not follow this contract. ``path`` points at the offending value;
    ``code`` is the :data:`ErrorCode` a server answers with."""

    def __init__(self, message: str, path: str = "$", code: str = "protocol.invalid") -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.code = code
        self.reason = message


class _Kind(TypedDict):
    type: Annotated[str, Meta(max_length=32)]


_KIND = msgspec.json.Decoder(_Kind)
_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    name: msgspec.json.Decoder(td) for name, td in MESSAGE_TYPES.items()
}


def _protocol_error(error: msgspec.ValidationError) -> ProtocolError:
    # msgspec says "Expected `int` >= 0 - at `$.gpus[0].index`": split the path off.
    text = str(error)
    message, sep, where = text.rpartition(" - at `")
    if sep and where.endswith("`"):
        return ProtocolError(message, where[:-1])
    return ProtocolError(text)


def _kind_of(obj: Any) -> type[Any]:
    if not isinstance(obj, dict):
        raise ProtocolError("a message must be a JSON object")
    kind = obj.get("type")
    td = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if td is None:
        raise ProtocolError(f"unknown message type {clip(repr(kind), 40)}", "$.type")
    return td


def validate(obj: Any, td: type[Any]) -> Any:
    """Check parsed JSON against the TypedDict ``td``; return its projection (unknown keys
    dropped, ints where floats are declared made floats). Raise :class:`ProtocolError` if not.

    Usable for the REST bodies and :class:`SimulatedGpuSpec` as well as for messages.
    """
    try:
        return msgspec.convert(obj, td)
    except msgspec.ValidationError as error:
        raise _protocol_error(error) from None
    except RecursionError:
        raise ProtocolError("nested too deeply") from None


def is_valid(obj: Any, td: type[Any]) -> bool:
    """Whether ``obj`` matches ``td`` (bounds included)."""
    try:
        validate(obj, td)
    except ProtocolError:
        return False
    return True


def validate_message(obj: Any, *, max_gpus: int = MAX_GPUS_PER_HOST) -> Message:
    """Check a parsed JSON object against the message type named by its ``"type"`` key and the
    rules of :func:`check_message`; return the projection (see the module docstring)."""
    message = cast(Message, validate(obj, _kind_of(obj)))
    check_message(message, max_gpus=max_gpus)
    return message


def decode(text: str | bytes, *, max_gpus: int = MAX_GPUS_PER_HOST) -> Message:
    """Parse and validate one message (one pass in C, then :func:`check_message`); return the
    projection. Raise :class:`ProtocolError` when malformed."""
    try:
        kind = _KIND.decode(text)["type"]
        decoder = _DECODERS.get(kind)
        if decoder is None:
            raise ProtocolError(f"unknown message type {clip(repr(kind), 40)}", "$.type")
        message = cast(Message, decoder.decode(text))
    except msgspec.ValidationError as error:
        if "Object missing required field `type`" in str(error):
            raise ProtocolError("unknown message type None", "$.type") from None
        if str(error).startswith("Expected `object`"):
            raise ProtocolError("a message must be a JSON object") from None
        raise _protocol_error(error) from None
    except msgspec.DecodeError as error:
        raise ProtocolError(f"not JSON: {error}", code="protocol.not_json") from None
    except RecursionError:
        raise ProtocolError("nested too deeply", code="protocol.not_json") from None
    if _holds_nul(text):
        # PostgreSQL's text cannot hold U+0000: stored, it would fail the sender's transaction
        # (or another's that reads it back); refused here, it costs the sender only.
        raise ProtocolError("a string holds U+0000 (NUL), which no field may")
    check_message(message, max_gpus=max_gpus)
    return message


def _holds_nul(text: str | bytes) -> bool:
    if isinstance(text, bytes):
        return b"\\u0000" in text and bool(_NUL.search(text.decode("utf-8", "replace")))
    return "\\u0000" in text and bool(_NUL.search(text))


def encode(msg: Message) -> str:
    """Serialise a message to compact JSON text, validating it first (a bug here is ours)."""
    validate_message(msg, max_gpus=MAX_GPUS_HARD)
    return json.dumps(msg, separators=(",", ":"), allow_nan=False)


# -- the rules a type cannot say ---------------------------------------------------------------


def check_message(message: Message, *, max_gpus: int = MAX_GPUS_PER_HOST) -> None:
    """Cross-field rules: at most ``max_gpus`` GPUs with unique UUIDs and indexes; per GPU,
    profile keys equal to their ids, placements inside the grid, MIG instances with unique ids
    and starts that do not overlap; telemetry MIG samples with unique instance ids; the lines of
    a ``logs`` answer within :data:`~hostagent.protocol.logs.MAX_LOG_BYTES`."""
    kind = message["type"]
    if kind == "hello":
        _check_gpu_infos(cast(Hello, message)["gpus"], "$.gpus", max_gpus)
    elif kind == "ack":
        _check_gpu_infos(cast(Ack, message)["observed"], "$.observed", max_gpus)
    elif kind == "telemetry":
        _check_telemetry(cast(Telemetry, message), max_gpus)
    elif kind == "desired_state":
        _check_desired(cast(DesiredState, message))
    elif kind == "workloads":
        report = cast(WorkloadReport, message)
        _unique([w["allocation_id"] for w in report["workloads"]], "$.workloads", "allocation_id")
    elif kind == "logs":
        _check_logs(cast(Logs, message))


def _check_logs(logs: Logs) -> None:
    """The lines within :data:`MAX_LOG_BYTES`; ``stamps`` and ``seqs``, where given, one per
    line, and ``seqs`` increasing (a cursor names one line)."""
    if log_bytes(logs["lines"]) > MAX_LOG_BYTES:
        raise ProtocolError(f"the lines are more than {MAX_LOG_BYTES} bytes of JSON", "$.lines")
    count = len(logs["lines"])
    stamps, seqs = logs.get("stamps"), logs.get("seqs")
    for key, values in (("stamps", stamps), ("seqs", seqs)):
        if values is not None and len(values) != count:
            raise ProtocolError(f"{len(values)} {key} for {count} lines", f"$.{key}")
    if seqs is not None and any(a >= b for a, b in itertools.pairwise(seqs)):
        raise ProtocolError("the seqs must increase", "$.seqs")


def _check_desired(desired: DesiredState) -> None:
    for uuid, gpu in desired["gpus"].items():
        for index, allocation in enumerate(gpu["allocations"]):
            workload = allocation.get("workload")
            if workload is None:
                continue
            problems = workload_problems(workload)
            if problems:
                field, reason = problems[0]
                path = f"$.gpus[{uuid!r}].allocations[{index}].workload.{field}"
                raise ProtocolError(reason, clip(path, 200))


def _unique(values: list[Any], path: str, what: str) -> None:
    if len(set(values)) != len(values):
        raise ProtocolError(f"duplicate {what}", path)


def _check_gpu_infos(gpus: list[GpuInfo], path: str, max_gpus: int) -> None:
    if len(gpus) > max_gpus:
        raise ProtocolError(f"more than {max_gpus} GPUs", path)
    _unique([g["uuid"] for g in gpus], path, "GPU uuid")
    _unique([g["index"] for g in gpus], path, "GPU index")
    if any(g["index"] >= max_gpus for g in gpus):
        raise ProtocolError(f"a GPU index is at least {max_gpus}", path)
    for i, gpu in enumerate(gpus):
        _check_gpu_info(gpu, f"{path}[{i}]")


def _check_gpu_info(gpu: GpuInfo, path: str) -> None:
    for key, profile in gpu["possible_placements"].items():
        where = f"{path}.possible_placements.{key}"
        if key != str(profile["profile_id"]):
            raise ProtocolError("the key must be the profile_id", where)
        for start, size in profile["placements"]:
            if size < 1 or start + size > MAX_MEMORY_SLICES:
                raise ProtocolError(f"placement [{start}, {size}] is outside the grid", where)
    instances = gpu["mig_instances"]
    _unique([i["gpu_instance_id"] for i in instances], f"{path}.mig_instances", "instance id")
    taken: set[int] = set()
    for n, instance in enumerate(instances):
        where = f"{path}.mig_instances[{n}]"
        slices = set(range(instance["start"], instance["start"] + instance["size"]))
        if max(slices) >= MAX_MEMORY_SLICES:
            raise ProtocolError("the instance is outside the grid", where)
        if slices & taken:
            raise ProtocolError("the instance overlaps another", where)
        taken |= slices
    _unique([d["target_uuid"] for d in gpu["mps"]["instances"]], f"{path}.mps", "target_uuid")


def _check_telemetry(telemetry: Telemetry, max_gpus: int) -> None:
    gpus = telemetry["gpus"]
    if len(gpus) > max_gpus:
        raise ProtocolError(f"more than {max_gpus} GPUs", "$.gpus")
    _unique([g["uuid"] for g in gpus], "$.gpus", "GPU uuid")
    for i, gpu in enumerate(gpus):
        mig = gpu["mig"]
        if len(mig) > 1:
            _unique([m["gpu_instance_id"] for m in mig], f"$.gpus[{i}].mig", "instance id")
