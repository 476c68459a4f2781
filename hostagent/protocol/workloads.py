"""The workload a replica runs, as the control plane asks for it and as the agent reports it.

A deployment's ``workload`` says what each of its replicas runs on its slice:

* ``{"runtime": "container", "image": ..., "command": [...], ...}``: a container, run by an agent
  whose runtime is ``docker``;
* ``{"runtime": "process", "command": [...], "cwd": ..., "user": ...}``: a process group, run by
  an agent whose runtime is ``docker`` or ``process``;
* ``{"runtime": "none"}`` (the default): nothing is started; the slice is reserved and an outside
  launcher reads the allocation's environment from the API.

The same rules (:func:`workload_problems`) check a workload where the API takes it and where the
agent receives it, and the same function (:func:`workload_environment`) says what Fleet puts in
its environment, so the API's ``environment`` and the launched process agree.

The agent reports each replica's :data:`WorkloadState` in ``workloads`` messages
(:class:`WorkloadStatus`): on every change, and the whole list after each (re)connection.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, TypedDict

from msgspec import Meta

from hostagent.protocol.bounds import MAX_PROCESSES, U32, Text, Timestamp
from hostagent.protocol.ports import MAX_PORTS, Port, PortName, PortSpec, port_problems

WorkloadRuntime = Literal["container", "process", "none"]
"""What a deployment asks for."""
AgentRuntime = Literal["docker", "process", "none"]
"""What an agent runs: ``docker`` runs containers and processes, ``process`` processes only,
``none`` nothing (reservations only, today's behaviour without a launcher)."""
RestartPolicy = Literal["always", "on-failure", "never"]
WorkloadState = Literal[
    "none", "pending", "starting", "running", "stopping", "exited", "failed", "crashloop"
]
"""``none``: nothing to run (runtime ``none``); ``pending``: wanted, not started yet (its slice
is being made, or its restart backoff runs); ``starting``: started, health check not passed yet;
``running``: up and healthy (or up, without a health check); ``stopping``: SIGTERM sent, waiting
up to ``stop_grace_s``; ``exited``: ended and not restarted (``restart`` said so);
``failed``: could not be started (bad image, missing command, no such user...);
``crashloop``: failed :data:`CRASHLOOP_FAILURES` times within :data:`CRASHLOOP_WINDOW_S`."""

RUNS_ON: dict[str, frozenset[str]] = {
    "container": frozenset({"docker"}),
    "process": frozenset({"docker", "process"}),
    "none": frozenset({"docker", "process", "none"}),
}
"""Which agent runtimes can run each workload runtime."""

MAX_ARGS = 128
"""Arguments of a command (the workload's, or an exec health check's)."""
MAX_ENV = 64
"""Environment variables a deployment may set."""
MAX_ARG_CHARS = 4096
"""Characters of one argument or one environment value."""
MAX_IMAGE_CHARS = 255
MAX_STOP_GRACE_S = 3600
DEFAULT_STOP_GRACE_S = 30
"""Seconds between SIGTERM and SIGKILL when a workload gives none (the one default: the API,
the agent's runtimes and adopted replicas read it from here)."""
CRASHLOOP_FAILURES = 5
CRASHLOOP_WINDOW_S = 600.0
RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0)
"""Waits before the 1st, 2nd, ... restart in a row (the last one repeats)."""

RESERVED_PREFIXES = ("CUDA_", "NVIDIA_")
"""Environment names Fleet sets itself (case-insensitively): a deployment may not set them."""
RESERVED_NAMES = frozenset({"FLEET_ALLOCATION_ID", "FLEET_DEPLOYMENT", "FLEET_REPLICA"})
RESERVED_FLEET_PREFIXES = ("FLEET_PORT_", "FLEET_HOST_PORT_")
"""The per-port variables (:func:`hostagent.protocol.ports.port_environment`)."""

LABEL_ALLOCATION = "fleet.allocation"
LABEL_DEPLOYMENT = "fleet.deployment"
LABEL_HOST = "fleet.host"
"""Labels of every container the agent runs (``fleet.allocation=<id>``...)."""

Arg = Annotated[str, Meta(max_length=MAX_ARG_CHARS)]
EnvName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
Seconds = Annotated[int, Meta(ge=1, le=3600)]
ExitCode = Annotated[int, Meta(ge=-255, le=255)]
"""A process's exit status; negative: killed by that signal (``-9``: SIGKILL)."""


class HttpCheck(TypedDict):
    """Healthy when ``GET http://127.0.0.1:<port><path>`` answers 2xx or 3xx in time."""

    port: Port
    path: Text


class TcpCheck(TypedDict):
    """Healthy when ``127.0.0.1:<port>`` accepts a connection in time."""

    port: Port


class ExecCheck(TypedDict):
    """Healthy when the command exits 0 in time (run inside the container, or beside the
    process with its environment)."""

    command: Annotated[list[Arg], Meta(min_length=1, max_length=MAX_ARGS)]


class _HealthCheckOptional(TypedDict, total=False):
    http: HttpCheck
    tcp: TcpCheck
    exec: ExecCheck


class HealthCheck(_HealthCheckOptional):
    """Exactly one of ``http``, ``tcp`` or ``exec``. A replica is ``running`` once a check has
    passed; ``retries`` failures in a row after that restart it (as its restart policy allows).
    Failures in the first ``start_period_s`` do not count."""

    interval_s: Seconds
    timeout_s: Annotated[int, Meta(ge=1, le=600)]
    retries: Annotated[int, Meta(ge=1, le=100)]
    start_period_s: Annotated[int, Meta(ge=0, le=3600)]


class _WorkloadOptional(TypedDict, total=False):
    # The ports it listens on (hostagent.protocol.ports); absent from a server older than
    # per-replica ports: none.
    ports: Annotated[list[PortSpec], Meta(max_length=MAX_PORTS)]


class Workload(_WorkloadOptional):
    """What each replica of a deployment runs (see the module docstring)."""

    runtime: WorkloadRuntime
    image: Annotated[str, Meta(max_length=MAX_IMAGE_CHARS)] | None
    command: Annotated[list[Arg], Meta(max_length=MAX_ARGS)]
    env: Annotated[dict[EnvName, Arg], Meta(max_length=MAX_ENV)]
    cwd: Text | None
    user: Text | None
    restart: RestartPolicy
    stop_grace_s: Annotated[int, Meta(ge=0, le=MAX_STOP_GRACE_S)]
    health: HealthCheck | None


class Security(TypedDict):
    """How the agent confines one replica's workload: the team's policy (fleet.core.policy)
    applied by the control plane, so the agent needs no policy of its own.

    * ``user``: ``uid[:gid]`` (or a name) the workload runs as; ``None`` keeps the image's user
      for a container (the agent then refuses an image whose user is root unless
      ``allow_root``). A process always has a ``user``.
    * ``allow_root``: uid 0 may run (an admin's policy said so).
    * ``cap_add``: capabilities added back after dropping all of them.
    * ``pids_limit`` / ``memory_mib``: the replica's PID and host-memory limits.
    * ``host_network``: the container uses the host's network (an admin's policy said so).
    """

    user: Text | None
    allow_root: bool
    cap_add: Annotated[list[Annotated[str, Meta(pattern=r"^[A-Z_]{1,32}$")]], Meta(max_length=16)]
    pids_limit: Annotated[int, Meta(ge=16, le=1_048_576)]
    memory_mib: Annotated[int, Meta(ge=16, le=16 * 1024 * 1024)] | None
    host_network: bool


def default_security() -> Security:
    """What a replica gets when the control plane sends no ``security`` (an older server): the
    restricted defaults."""
    return {
        "user": None,
        "allow_root": False,
        "cap_add": [],
        "pids_limit": 4096,
        "memory_mib": None,
        "host_network": False,
    }


class _WorkloadStatusOptional(TypedDict, total=False):
    # The replica's host port per declared port name (hostagent.protocol.ports); absent from an
    # agent older than per-replica ports.
    ports: Annotated[dict[PortName, Port], Meta(max_length=MAX_PORTS)]


class WorkloadStatus(_WorkloadStatusOptional):
    """One replica's workload as the agent sees it. ``pids`` are its host PIDs (the container's
    or the process group's), so the processes NVML reports can be named by replica."""

    allocation_id: Annotated[int, Meta(ge=1, le=2**63 - 1)]
    state: WorkloadState
    started_at: Timestamp | None
    exit_code: ExitCode | None
    restarts: Annotated[int, Meta(ge=0, le=2**31 - 1)]
    message: Text
    pids: Annotated[list[U32], Meta(max_length=MAX_PROCESSES)]


# --------------------------------------------------------------------------------------------
# Rules a type cannot say, and defaults
# --------------------------------------------------------------------------------------------

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = re.compile(
    rf"^(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$"
)
"""The Docker image reference grammar (``distribution/reference``): ``[host[:port]/]path[:tag]
[@digest]``, lower-case path components."""


def is_image_reference(image: str) -> bool:
    """``image`` follows the grammar, and its first component is a registry only when Docker
    would read it as one (it holds ``.`` or ``:``, or is ``localhost``); otherwise it is a
    lower-case path component, as ``docker pull`` requires."""
    if len(image) > MAX_IMAGE_CHARS or not IMAGE_REFERENCE.match(image):
        return False
    first, slash, _ = image.partition("/")
    registry = slash and ("." in first or ":" in first or first == "localhost")
    return bool(registry) or not any(c.isupper() for c in first)


_USER = re.compile(
    r"^(?:[a-z_][a-z0-9_.-]{0,31}|[0-9]{1,10})(?::(?:[a-z_][a-z0-9_.-]{0,31}|[0-9]{1,10}))?$"
)
"""A user name or uid, optionally ``:group`` (name or gid)."""


def default_workload() -> Workload:
    """``{"runtime": "none"}`` with every field at its default."""
    return {
        "runtime": "none",
        "image": None,
        "command": [],
        "env": {},
        "cwd": None,
        "user": None,
        "restart": "always",
        "stop_grace_s": DEFAULT_STOP_GRACE_S,
        "health": None,
        "ports": [],
    }


def default_health() -> HealthCheck:
    return {"interval_s": 10, "timeout_s": 3, "retries": 3, "start_period_s": 0}


def workload_problems(workload: Workload) -> list[tuple[str, str]]:
    """``(field, message)`` for each rule ``workload`` breaks (after its type was checked)."""
    problems: list[tuple[str, str]] = []
    runtime = workload["runtime"]
    image = workload["image"]
    if runtime == "container":
        if not image:
            problems.append(("image", "A container workload needs an image."))
        elif not is_image_reference(image):
            problems.append(
                ("image", "Not an image reference (expected [registry/]name[:tag][@digest]).")
            )
    elif image:
        problems.append(("image", f"Only a container workload has an image, not {runtime}."))
    if runtime == "process" and not workload["command"]:
        problems.append(("command", "A process workload needs a command."))
    if runtime == "none" and (workload["command"] or workload["env"] or workload["health"]):
        problems.append(
            ("runtime", "A workload with runtime 'none' runs nothing: no command, env or health.")
        )
    for index, arg in enumerate(workload["command"]):
        if "\x00" in arg:
            problems.append((f"command[{index}]", "An argument cannot contain a NUL character."))
    for name, value in workload["env"].items():
        upper = name.upper()
        if upper.startswith(RESERVED_PREFIXES) or upper in RESERVED_NAMES:
            problems.append(
                (f"env.{name}", "Fleet sets CUDA_*, NVIDIA_* and FLEET_* device variables itself.")
            )
        elif upper.startswith(RESERVED_FLEET_PREFIXES):
            problems.append(
                (f"env.{name}", "Fleet sets FLEET_PORT_* and FLEET_HOST_PORT_* itself.")
            )
        if "\x00" in value:
            problems.append((f"env.{name}", "A value cannot contain a NUL character."))
    cwd = workload["cwd"]
    if cwd is not None and (not cwd.startswith("/") or "\x00" in cwd):
        problems.append(("cwd", "The working directory must be an absolute path."))
    user = workload["user"]
    if user is not None and not _USER.match(user):
        problems.append(("user", "Expected a user name or uid, optionally with :group."))
    health = workload["health"]
    if health is not None:
        probes = [name for name in ("http", "tcp", "exec") if name in health]
        if len(probes) != 1:
            problems.append(("health", "Give exactly one of 'http', 'tcp' or 'exec'."))
        http = health.get("http")
        if http is not None and (
            not http["path"].startswith("/") or any(c.isspace() for c in http["path"])
        ):
            problems.append(
                ("health.http.path", "The path must start with '/' and hold no spaces.")
            )
        check = health.get("exec")
        if check is not None and any("\x00" in arg for arg in check["command"]):
            problems.append(("health.exec.command", "An argument cannot contain a NUL character."))
        if health["timeout_s"] > health["interval_s"]:
            problems.append(("health.timeout_s", "The timeout cannot exceed the interval."))
    return problems + port_problems(workload)


# --------------------------------------------------------------------------------------------
# The environment Fleet gives every workload
# --------------------------------------------------------------------------------------------

MPS_DEVICE = "0"
"""How an MPS client's one visible device is named in ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: its
``CUDA_VISIBLE_DEVICES`` holds exactly one device, so ordinal 0 names it, without relying on MPS
accepting ``MIG-`` UUIDs there (agent review D16)."""


def workload_environment(
    *,
    device_uuid: str,
    allocation_id: int,
    deployment: str,
    replica: int,
    mps_pipe_directory: str | None = None,
    mps_memory_mib: int | None = None,
    mps_compute_percent: int | None = None,
) -> dict[str, str]:
    """The variables Fleet sets in a replica's environment, whatever the runtime.

    ``device_uuid`` is the replica's MIG instance (``MIG-...``) or GPU (``GPU-...``), or its
    GPUs joined by commas (a replica of several whole GPUs: ``GPU-a,GPU-b``). An MPS
    share (``mps_pipe_directory`` given) adds the daemon's pipe directory and the share's limits,
    as ECS sets them. A client's ``CUDA_MPS_*`` can only lower its MPS server's limits, which the
    agent sets on the daemon (``hostagent.mps.limits``): a workload that re-exports them higher
    gets the server's.
    """
    env = {
        "CUDA_VISIBLE_DEVICES": device_uuid,
        "NVIDIA_VISIBLE_DEVICES": device_uuid,
        "FLEET_ALLOCATION_ID": str(allocation_id),
        "FLEET_DEPLOYMENT": deployment,
        "FLEET_REPLICA": str(replica),
    }
    if mps_pipe_directory is not None:
        env["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_directory
        if mps_memory_mib is not None:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{MPS_DEVICE}={mps_memory_mib}M"
        if mps_compute_percent is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps_compute_percent)
    return env
