"""What the supervisor asks of a runtime (:class:`Runtime`), and the values it passes around.

A runtime starts, stops, watches and finds again the workloads of one kind: containers
(:mod:`hostagent.runtime.docker`, the one module importing ``docker``) or process groups
(:mod:`hostagent.runtime.process`). It knows nothing of restart policies, health or the
control plane: that is the supervisor's job, so both runtimes behave the same there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from hostagent.protocol import (
    DEFAULT_STOP_GRACE_S,
    Scrape,
    Security,
    Workload,
    declared_ports,
    default_security,
    port_environment,
)
from hostagent.runtime.output import Output

RuntimeName = Literal["docker", "process"]
ImagePull = Literal["always", "if-not-present"]
"""When the Docker runtime pulls an image: before every create, or only when it is missing."""
IMAGE_PULLS: tuple[ImagePull, ...] = ("always", "if-not-present")

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""``PATH`` of a process workload (the workload's ``env`` may override it)."""
BASE_LANG = "C.UTF-8"
PROCESS_RUNTIME_OFF = (
    "this host does not run process workloads: start the agent with --allow-process-runtime"
)


class RuntimeUnavailable(RuntimeError):
    """The runtime cannot be used on this host (no Docker daemon answers, say)."""


class StartError(RuntimeError):
    """A workload could not be started (no such image, command or user); the message says why
    in words an operator can act on, and is what the replica reports as ``failed``."""


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica to run, resolved on this host: the desired allocation, its workload and the
    device it landed on.

    Attributes:
        device_uuid: the MIG instance (``MIG-…``) or GPU (``GPU-…``) the replica runs on, or
            its GPUs joined by commas (a replica of several whole GPUs); ``None`` while its
            partition does not exist (the replica stays ``pending``).
        environment: what Fleet sets (:func:`hostagent.protocol.workload_environment`),
            added over the workload's own ``env``.
        mps_pipe_directory: the MPS daemon's pipe directory when the replica is an MPS share
            (containers get it mounted and ``ipc=host``).
        gpu_request: ask Docker for the device (``--gpus device=<uuid>``): true on the NVML
            backend, false on the simulated one (there is no such device to hand over).
        security: how the workload is confined (the desired allocation's ``security``);
            ``None`` from a server that sends none: see :meth:`confinement`.
        secret_env: the names in the workload's ``env`` whose values are team secrets (the
            desired allocation's ``secret_env``): kept in memory only (the replica store
            drops their values), masked in the replica's logs, and left out of
            :meth:`fingerprint` (a new value reaches a replica when it starts again, as a
            Kubernetes secret in env does; the control plane rolls it out on request).
        host_ports: the replica's host port per declared port name, given by the supervisor
            (:meth:`with_host_ports`), kept across agent restarts by the replica store.
        drain_s: how long it stays up, reported ``stopping``, before SIGTERM when it is no
            longer wanted or is replaced (the desired allocation's ``drain_s``); not part of
            :meth:`fingerprint`.
        scrape: the replica's own metrics to read and report (the desired allocation's
            ``scrape``: :mod:`hostagent.runtime.metrics`); not part of :meth:`fingerprint`,
            nor kept by the replica store (the next desired state says it again).
    """

    allocation_id: int
    key: str
    gpu_uuid: str
    deployment: str
    replica: int
    workload: Workload
    device_uuid: str | None
    environment: dict[str, str] = field(default_factory=dict)
    mps_pipe_directory: str | None = None
    gpu_request: bool = False
    security: Security | None = None
    secret_env: tuple[str, ...] = ()
    host_ports: dict[str, int] = field(default_factory=dict)
    drain_s: int = 0
    scrape: Scrape | None = None

    def confinement(self) -> Security:
        """The ``security`` to apply: the one sent, else the restricted defaults with the
        workload's own ``user`` (what a server older than ``security`` meant)."""
        if self.security is not None:
            return self.security
        return {**default_security(), "user": self.workload["user"]}

    def fingerprint(self) -> str:
        """What a launch depends on: a replica whose fingerprint changes is started again."""
        return json.dumps(self.fingerprint_parts(), sort_keys=True)

    def fingerprint_parts(self) -> dict[str, Any]:
        """:meth:`fingerprint`'s parts by name (a replacement's log names those that changed)."""
        parts: dict[str, Any] = {
            "workload": self._workload_without_secrets(),
            "device_uuid": self.device_uuid,
            "environment": self.environment,
            "mps_pipe_directory": self.mps_pipe_directory,
            "gpu_request": self.gpu_request,
        }
        if self.security is not None:
            parts["security"] = self.security
        # Only where the agent chose them: a replica without any (or in the host's network, on
        # its declared ports) keeps the fingerprint it had before ports existed.
        if self.host_ports and self.allocates_ports():
            parts["host_ports"] = self.host_ports
        return parts

    def _workload_without_secrets(self) -> Workload:
        if not self.secret_env:
            return self.workload
        env = {k: v for k, v in self.workload["env"].items() if k not in self.secret_env}
        return {**self.workload, "env": env}

    def secret_values(self) -> list[str]:
        """The values of the secrets in the workload's env (those it still holds)."""
        env = self.workload["env"]
        return [env[name] for name in self.secret_env if name in env]

    def secrets_missing(self) -> bool:
        """A secret's value is not here (a spec read back from the store): it cannot start
        until the control plane sends the replica again."""
        return any(name not in self.workload["env"] for name in self.secret_env)

    def full_environment(self) -> dict[str, str]:
        """The workload's ``env`` with Fleet's variables over it (Fleet's always win), its
        ports' included."""
        ports = port_environment(
            declared_ports(self.workload), self.host_ports, in_container=self.bridged()
        )
        return {**self.workload["env"], **self.environment, **ports}

    def bridged(self) -> bool:
        """A container on the agent's bridge network (not the host's): it listens on its
        declared ports, published on its host ports."""
        return self.workload["runtime"] == "container" and not self.confinement()["host_network"]

    def allocates_ports(self) -> bool:
        """Whether the replica needs host ports from the agent's range: it declares ports and
        is not a container in the host's network (that one binds its declared ports)."""
        return bool(declared_ports(self.workload)) and (
            self.workload["runtime"] != "container" or self.bridged()
        )

    def fixed_ports(self) -> dict[str, int]:
        """The host ports of a container in the host's network: its declared ports."""
        if self.allocates_ports():
            return {}
        return {p["name"]: p["port"] for p in declared_ports(self.workload)}


@dataclass(frozen=True)
class Running:
    """A started workload as its runtime identifies it.

    ``ident`` is the container ID, or ``<pid>:<start ticks>`` for a process (the start time
    from ``/proc/<pid>/stat`` tells a reused PID from ours). ``pid`` is the container's init or
    the process group leader, as the host sees it (``None`` when not known).
    """

    allocation_id: int
    runtime: RuntimeName
    ident: str
    started_at: float
    pid: int | None
    gpu_uuid: str | None = None
    deployment: str = ""
    stop_grace_s: int = DEFAULT_STOP_GRACE_S
    host_ports: dict[str, int] = field(default_factory=dict)
    """The host ports it was started with (a container's labels say them), for an adoption
    without the replica store."""
    address: str | None = None
    """Where its own network answers (a bridged container's IP), for the health checks."""


@dataclass(frozen=True)
class Exit:
    """How a workload ended; ``exit_code`` is ``None`` when it cannot be known (a process that
    ended while another agent process was its parent), negative for a signal (``-9``)."""

    exit_code: int | None
    message: str = ""


@dataclass(frozen=True)
class Found:
    """A workload of this host found at start (adoption): still running when ``exit`` is
    ``None``."""

    running: Running
    exit: Exit | None


class Runtime(Protocol):
    """Starts and watches workloads of one kind. Every method may block (a pull, a stop with
    its grace period): the supervisor calls them from its worker threads, never from the
    agent's loop. Methods other than :meth:`start` raise nothing but ``OSError`` or
    :class:`RuntimeUnavailable` when the runtime itself fails."""

    name: RuntimeName
    refusal: str | None
    """Why this runtime starts no workload on this host (``None``: it does); it still finds,
    watches and stops the ones an earlier agent started."""

    def start(self, spec: ReplicaSpec) -> Running:
        """Start the replica's workload; raises :class:`StartError` saying why not."""
        ...

    def stop(self, running: Running, grace_s: float) -> Exit:
        """SIGTERM, wait up to ``grace_s``, SIGKILL; return once it has exited."""
        ...

    def observe(self, running: Sequence[Running]) -> dict[str, Exit]:
        """Which of ``running`` have ended (by ``ident``), and how."""
        ...

    def find(self) -> list[Found]:
        """The workloads this host runs with this runtime (containers by label, processes by
        the state file and their start time)."""
        ...

    def exec_check(
        self, running: Running, spec: ReplicaSpec, command: list[str], timeout_s: float
    ) -> int:
        """Run a health check command inside the container, or beside the process with its
        environment; return its exit status. Raises ``TimeoutError`` past ``timeout_s``."""
        ...

    def discard(self, running: Running) -> None:
        """Forget an ended workload (remove the container, drop the state entry)."""
        ...

    def maintain(self) -> None:
        """Periodic housekeeping (rotate process logs)."""
        ...

    def capture(self) -> None:
        """Read the replicas' new output into their rings, stamped (process logs; Docker
        stamps its own): called every supervision tick, from a worker thread."""
        ...

    def logs(self, allocation_id: int, tail: int, *, before: int | None = None) -> Output:
        """The last ``tail`` lines of the replica's output (stdout and stderr), running or
        ended, older than cursor ``before`` where given; raises
        :class:`~hostagent.runtime.output.NoOutput` saying why there are none."""
        ...


def by_ident(running: Sequence[Running]) -> dict[str, Running]:
    """Index handles by ``ident``."""
    return {r.ident: r for r in running}
