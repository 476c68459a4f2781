"""What the supervisor was last told to run, kept across agent restarts (``replicas.json``).

A restarted agent must go on supervising the workloads it finds (restarts, health checks) before
the control plane answers, and must tell the workloads it was given from those it was not: the
specs of the last desired state, with each replica's restart count, are written here (0600,
atomically) whenever they change. The values of team secrets are not (``secret_env`` names them):
a replica read back with a secret missing waits for the control plane to send it again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostagent.protocol import (
    MAX_DRAIN_S,
    Port,
    PortName,
    ProtocolError,
    Security,
    Workload,
    validate,
)
from hostagent.runtime.base import ReplicaSpec
from hostagent.runtime.process import write_json_atomic

logger = logging.getLogger(__name__)

STORE_FILE = "replicas.json"


@dataclass(frozen=True)
class Stored:
    """A replica as last given, and how often it was restarted."""

    spec: ReplicaSpec
    restarts: int


def _to_json(stored: Stored) -> dict[str, Any]:
    s = stored.spec
    secret = set(s.secret_env)
    env = {k: v for k, v in s.workload["env"].items() if k not in secret}
    return {
        "allocation_id": s.allocation_id,
        "key": s.key,
        "gpu_uuid": s.gpu_uuid,
        "deployment": s.deployment,
        "replica": s.replica,
        "workload": {**s.workload, "env": env},
        "secret_env": sorted(secret),
        "device_uuid": s.device_uuid,
        "environment": s.environment,
        "mps_pipe_directory": s.mps_pipe_directory,
        "gpu_request": s.gpu_request,
        "security": s.security,
        "host_ports": s.host_ports,
        "drain_s": s.drain_s,
        "restarts": stored.restarts,
    }


def _from_json(data: dict[str, Any]) -> Stored:
    workload: Workload = validate(data["workload"], Workload)
    host_ports = validate(data.get("host_ports") or {}, dict[PortName, Port])
    environment = {str(k): str(v) for k, v in dict(data["environment"]).items()}
    spec = ReplicaSpec(
        allocation_id=int(data["allocation_id"]),
        key=str(data["key"]),
        gpu_uuid=str(data["gpu_uuid"]),
        deployment=str(data["deployment"]),
        replica=int(data["replica"]),
        workload=workload,
        device_uuid=None if data["device_uuid"] is None else str(data["device_uuid"]),
        environment=environment,
        mps_pipe_directory=data.get("mps_pipe_directory"),
        gpu_request=bool(data.get("gpu_request", False)),
        secret_env=tuple(str(name) for name in data.get("secret_env", [])),
        # How it was confined: part of the fingerprint, so that a restarted agent adopts the
        # replica it left running instead of starting it again.
        security=None if data.get("security") is None else validate(data["security"], Security),
        host_ports=dict(host_ports),
        drain_s=min(max(int(data.get("drain_s", 0)), 0), MAX_DRAIN_S),
    )
    return Stored(spec, int(data.get("restarts", 0)))


class ReplicaStore:
    """``<state dir>/replicas.json``; without a state directory, nothing is kept."""

    def __init__(self, state_dir: Path | None) -> None:
        self.path = None if state_dir is None else state_dir / STORE_FILE

    def load(self) -> dict[int, Stored]:
        """The replicas last saved (an unreadable file is logged and ignored)."""
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            entries = [_from_json(entry) for entry in data["replicas"]]
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ProtocolError) as exc:
            logger.warning("ignoring unreadable %s: %s", self.path, exc)
            return {}
        return {e.spec.allocation_id: e for e in entries}

    def save(self, replicas: list[Stored]) -> None:
        """Replace the file with ``replicas``."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        entries = [_to_json(r) for r in sorted(replicas, key=lambda r: r.spec.allocation_id)]
        try:
            write_json_atomic(self.path, {"version": 1, "replicas": entries})
        except OSError as exc:
            logger.warning("cannot write %s: %s", self.path, exc)
