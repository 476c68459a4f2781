"""Agent settings: ``FLEET_AGENT_*`` environment variables, overridden by command-line flags.

| variable | flag | default |
|---|---|---|
| ``FLEET_AGENT_SERVER`` | ``--server`` | required unless ``--once`` |
| ``FLEET_AGENT_TOKEN`` | ``--token`` | read from the token file |
| ``FLEET_AGENT_TOKEN_FILE`` | ``--token-file`` | ``/var/lib/fleet-agent/state.json`` |
| ``FLEET_AGENT_ENROLLMENT_TOKEN`` | ``--enroll`` / ``--enroll-file`` | none |
| ``FLEET_AGENT_INSECURE`` | ``--insecure`` | off: no TLS only on loopback |
| ``FLEET_AGENT_BACKEND`` | ``--backend`` | ``nvml`` |
| ``FLEET_AGENT_SIMULATE`` | ``--simulate`` | none (implies ``--backend simulated``) |
| ``FLEET_AGENT_SEED`` | ``--seed`` | ``0`` |
| ``FLEET_AGENT_ALLOW_MUTATION`` | ``--allow-mutation`` | off |
| ``FLEET_AGENT_INTERVAL`` | ``--interval`` | ``1.0`` s |
| ``FLEET_AGENT_TRANSPORT`` | ``--transport`` | ``ws`` |
| ``FLEET_AGENT_MPS_DIR`` | ``--mps-dir`` | ``/run/fleet-mps`` (0755, for non-root MPS clients) |
| ``FLEET_AGENT_HOSTNAME`` | ``--hostname`` | ``socket.gethostname()`` |
| ``FLEET_AGENT_FAULT_DIR`` | ``--fault-dir`` | none (simulated backend only: fault injection) |
| ``FLEET_AGENT_RUNTIME`` | ``--runtime`` | ``docker`` if its daemon answers, else ``process`` |
| ``FLEET_AGENT_STATE_DIR`` | ``--state-dir`` | ``workloads/`` beside the token file |
| ``FLEET_AGENT_ALLOW_PROCESS_RUNTIME`` | ``--allow-process-runtime`` | off: no process workloads |
| ``FLEET_AGENT_PROCESS_AS_AGENT_USER`` | ``--process-as-agent-user`` | off (development only) |
| ``FLEET_AGENT_CGROUP_BASE`` | ``--cgroup-base`` | the agent's own cgroup (v2) |
| ``FLEET_AGENT_IMAGE_PULL`` | ``--image-pull`` | ``always`` (or ``if-not-present``) |

Without ``--allow-mutation`` the runtime is ``none``: such an agent changes nothing on its host.
The state directory holds the process runtime's state file and the processes' logs; it is kept
0700 and the token file 0600, both the agent's user's (checked at start).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import re
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hostagent.mps import DEFAULT_BASE_DIR
from hostagent.protocol import AgentRuntime, ProtocolError, SimulatedGpuSpec, validate
from hostagent.runtime.base import IMAGE_PULLS, ImagePull
from hostagent.runtime.ports import (
    DEFAULT_NETWORK,
    DEFAULT_PORT_RANGE,
    DEFAULT_PUBLISH_ADDRESS,
    PortRange,
)

logger = logging.getLogger(__name__)

DEFAULT_STATE_FILE = Path("/var/lib/fleet-agent/state.json")
TRUE = {"1", "true", "yes", "on"}
RUNTIMES: tuple[AgentRuntime, ...] = ("docker", "process", "none")
NETWORK_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
ADDRESS = re.compile(r"^[A-Za-z0-9._:\[\]-]{1,253}$")
"""What hello's ``address`` may hold (``hostagent.protocol.Hello``)."""


class ConfigError(ValueError):
    """A setting is missing or malformed."""


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent needs to run."""

    server: str | None = None
    token: str | None = None
    token_file: Path = DEFAULT_STATE_FILE
    enrollment_token: str | None = None
    backend: Literal["nvml", "simulated"] = "nvml"
    simulate: Path | None = None
    seed: int = 0
    allow_mutation: bool = False
    interval_s: float = 1.0
    transport: Literal["ws", "rest"] = "ws"
    mps_dir: Path = DEFAULT_BASE_DIR
    hostname: str = ""
    fault_dir: Path | None = None
    runtime: AgentRuntime | None = None
    """``None``: chosen at start (:func:`hostagent.runtime.default_runtime`)."""
    state_dir: Path | None = None
    # Talk to a server without TLS off loopback (the tokens travel in clear).
    insecure: bool = False
    # Run process workloads at all (review H1: off by default, as Nomad's raw_exec).
    allow_process_runtime: bool = False
    # Development only: a process workload without a user runs as the agent's own user.
    process_as_agent_user: bool = False
    # The cgroup v2 path (below /sys/fs/cgroup) the replicas' cgroups go under; None: the
    # agent's own.
    cgroup_base: str | None = None
    image_pull: ImagePull = "always"
    # Per-replica host ports (hostagent.runtime.ports): the range they come from, the Docker
    # network bridged containers join, the address their ports are published at, and the
    # address this host is reached at (reported in hello; None: the publish address, or the
    # hostname when that is a wildcard).
    port_range: str = DEFAULT_PORT_RANGE
    container_network: str = DEFAULT_NETWORK
    publish_address: str = DEFAULT_PUBLISH_ADDRESS
    address: str | None = None

    def check_ports(self) -> None:
        """Raise :class:`ConfigError` when a port flag is malformed."""
        try:
            PortRange.parse(self.port_range)
        except ValueError as exc:
            raise ConfigError(f"--port-range: {exc}") from exc
        try:
            ipaddress.ip_address(self.publish_address)
        except ValueError:
            raise ConfigError(
                f"--publish-address must be an IP address, not {self.publish_address!r}"
            ) from None
        if not NETWORK_NAME.match(self.container_network):
            raise ConfigError(
                f"--container-network: not a network name: {self.container_network!r}"
            )
        if self.address is not None and not ADDRESS.match(self.address):
            raise ConfigError(f"--address must be a host name or IP address, not {self.address!r}")

    @property
    def reported_address(self) -> str:
        """What hello says this host is reached at (see ``address``)."""
        if self.address:
            return self.address
        if ipaddress.ip_address(self.publish_address).is_unspecified:
            # A hostname hello cannot carry is left out: the API then shows no address.
            return self.hostname if ADDRESS.match(self.hostname) else ""
        return self.publish_address

    @property
    def workload_dir(self) -> Path:
        """Where the runtime keeps its state and the processes' logs."""
        return self.state_dir or self.token_file.parent / "workloads"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AgentConfig:
        """Read ``FLEET_AGENT_*`` variables."""
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(f"FLEET_AGENT_{name}")
            return value if value else None

        simulate = get("SIMULATE")
        backend = get("BACKEND") or ("simulated" if simulate else "nvml")
        transport = get("TRANSPORT") or "ws"
        if backend not in ("nvml", "simulated"):
            raise ConfigError(f"FLEET_AGENT_BACKEND must be nvml or simulated, not {backend!r}")
        if transport not in ("ws", "rest"):
            raise ConfigError(f"FLEET_AGENT_TRANSPORT must be ws or rest, not {transport!r}")
        image_pull = get("IMAGE_PULL") or "always"
        if image_pull not in IMAGE_PULLS:
            raise ConfigError(
                f"FLEET_AGENT_IMAGE_PULL must be always or if-not-present, not {image_pull!r}"
            )
        runtime = get("RUNTIME")
        if runtime is not None and runtime not in RUNTIMES:
            raise ConfigError(
                f"FLEET_AGENT_RUNTIME must be docker, process or none, not {runtime!r}"
            )
        try:
            return cls(
                server=get("SERVER"),
                token=get("TOKEN"),
                token_file=Path(get("TOKEN_FILE") or DEFAULT_STATE_FILE),
                enrollment_token=get("ENROLLMENT_TOKEN"),
                backend="simulated" if backend == "simulated" else "nvml",
                simulate=Path(simulate) if simulate else None,
                seed=int(get("SEED") or 0),
                allow_mutation=(get("ALLOW_MUTATION") or "").lower() in TRUE,
                interval_s=float(get("INTERVAL") or 1.0),
                transport="rest" if transport == "rest" else "ws",
                mps_dir=Path(get("MPS_DIR") or DEFAULT_BASE_DIR),
                hostname=get("HOSTNAME") or socket.gethostname(),
                fault_dir=Path(fault_dir) if (fault_dir := get("FAULT_DIR")) else None,
                runtime=next((r for r in RUNTIMES if r == runtime), None),
                state_dir=Path(state_dir) if (state_dir := get("STATE_DIR")) else None,
                insecure=(get("INSECURE") or "").lower() in TRUE,
                allow_process_runtime=(get("ALLOW_PROCESS_RUNTIME") or "").lower() in TRUE,
                process_as_agent_user=(get("PROCESS_AS_AGENT_USER") or "").lower() in TRUE,
                cgroup_base=get("CGROUP_BASE"),
                image_pull=next(p for p in IMAGE_PULLS if p == image_pull),
                port_range=get("PORT_RANGE") or DEFAULT_PORT_RANGE,
                container_network=get("CONTAINER_NETWORK") or DEFAULT_NETWORK,
                publish_address=get("PUBLISH_ADDRESS") or DEFAULT_PUBLISH_ADDRESS,
                address=get("ADDRESS"),
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc


def load_specs(path: Path) -> tuple[list[SimulatedGpuSpec], int | None]:
    """Read a simulation file: a list of specs, or ``{"gpus": [...], "seed": n}``."""
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    seed = None
    if isinstance(data, dict):
        seed = data.get("seed")
        data = data.get("gpus")
    if not isinstance(data, list):
        raise ConfigError(f"{path}: expected a list of GPU specs")
    try:
        for spec in data:
            validate(spec, SimulatedGpuSpec)
    except ProtocolError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return data, seed if isinstance(seed, int) else None


@dataclass(frozen=True)
class AgentState:
    """What the agent persists: its host token and the last generation it applied.

    ``given_token_sha256``: the SHA-256 (hex) of the token given with ``--token`` or
    ``FLEET_AGENT_TOKEN`` that ``token`` was renewed from, directly or not (the server renews
    host tokens before they expire). An agent restarted with that same ``--token`` uses the
    renewed ``token`` instead, which the server still accepts."""

    token: str
    host_id: str = ""
    applied_generation: int = 0
    given_token_sha256: str = ""


def token_sha256(token: str) -> str:
    """Names a token in the state file without being it (:attr:`AgentState.given_token_sha256`)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def read_state(path: Path) -> AgentState | None:
    """The state file, or ``None`` if absent."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("token"), str):
        raise ConfigError(f"{path}: no token")
    return AgentState(
        token=data["token"],
        host_id=str(data.get("host_id", "")),
        applied_generation=int(data.get("applied_generation", 0)),
        given_token_sha256=str(data.get("given_token_sha256", "")),
    )


def write_state(path: Path, state: AgentState) -> None:
    """Write the state file atomically with mode 0600 (it holds a secret): a crash leaves the
    old file or the new one, never a torn token."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(
            {
                "token": state.token,
                "host_id": state.host_id,
                "applied_generation": state.applied_generation,
                "given_token_sha256": state.given_token_sha256,
            },
            fh,
        )
        # On disk before the rename: a power cut after a token renewal must not leave an
        # empty file where the only token the server accepts should be.
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def ensure_private(path: Path, mode: int) -> None:
    """Keep ``path`` the agent's own: owned by its user, no permission beyond ``mode`` (0600
    for the token file, 0700 for the state directory), so no workload, which never runs as the
    agent's user, can read the host token or another replica's log. Looser modes are
    tightened (with a warning); a missing path is left to be created.

    Raises:
        ConfigError: ``path`` belongs to another user.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"cannot check {path}: {exc.strerror}") from exc
    if info.st_uid != os.geteuid():
        raise ConfigError(
            f"{path} belongs to uid {info.st_uid}, not to the agent's user (uid {os.geteuid()}): "
            "it holds the agent's secrets and must be the agent's own"
        )
    if stat.S_IMODE(info.st_mode) & ~mode:
        logger.warning("%s had mode %o: now %o", path, stat.S_IMODE(info.st_mode), mode)
        os.chmod(path, mode)
