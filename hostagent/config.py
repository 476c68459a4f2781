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

Without ``--allow-mutation`` the runtime is ``none``: such an agent changes nothing on its host.
The state directory holds the process runtime's state file and the processes' logs.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hostagent.mps import DEFAULT_BASE_DIR
from hostagent.protocol import AgentRuntime, ProtocolError, SimulatedGpuSpec, validate

DEFAULT_STATE_FILE = Path("/var/lib/fleet-agent/state.json")
TRUE = {"1", "true", "yes", "on"}
RUNTIMES: tuple[AgentRuntime, ...] = ("docker", "process", "none")


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
    """What the agent persists: its host token and the last generation it applied."""

    token: str
    host_id: str = ""
    applied_generation: int = 0


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
    )


def write_state(path: Path, state: AgentState) -> None:
    """Write the state file atomically with mode 0600 (it holds a secret)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(
            {
                "token": state.token,
                "host_id": state.host_id,
                "applied_generation": state.applied_generation,
            },
            fh,
        )
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
