"""The Docker runtime: each replica is one container, through the Docker Engine API.

This is the only module that imports the ``docker`` package (an import-linter contract says
so), as :mod:`hostagent.gpu.nvml` is for NVML. What every container gets, and why:

* the labels ``fleet.allocation``, ``fleet.deployment`` and ``fleet.host`` (plus the GPU and
  the stop grace period): a restarted agent finds its containers by label, never by name;
* the host's network (a health check on ``127.0.0.1:<port>`` reaches the workload) and no
  restart policy of Docker's own: the agent counts restarts, backs off and says ``crashloop``;
* on the NVML backend, the device request ``docker run --gpus device=<uuid>`` sends (driver
  ``nvidia``, capabilities ``[["gpu"]]``, the MIG or GPU UUID); none on the simulated backend;
* for an MPS share, ``ipc=host`` and the daemon's pipe directory mounted at the same path, as
  the MPS client inside must reach the host's daemon (MPS doc, "Containers").
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import docker
import docker.errors
import docker.types

from hostagent.protocol import LABEL_ALLOCATION, LABEL_DEPLOYMENT, LABEL_HOST
from hostagent.runtime.base import (
    Exit,
    Found,
    ReplicaSpec,
    Running,
    RuntimeName,
    RuntimeUnavailable,
    StartError,
)
from hostagent.runtime.output import NoOutput, Output, split_lines

logger = logging.getLogger(__name__)

LABEL_GPU = "fleet.gpu"
LABEL_STOP_GRACE = "fleet.stop-grace-s"
LABEL_REPLICA = "fleet.replica"
API_TIMEOUT_S = 60
"""Per request; a stop adds its grace period, a pull has none (docker-py does both)."""
POOL_SIZE = 16
"""Connections to the daemon: the supervisor's workers and its watcher call at once."""
LOG_OPTIONS = {"max-size": "10m", "max-file": "2"}
"""Rotation for containers logged by ``json-file`` (Docker's default keeps logs forever)."""
_EXEC_POLL_S = 0.05
_NAME = re.compile(r"[^a-zA-Z0-9_.-]")
_RUNNING_STATES = ("running", "restarting", "paused")


def docker_answers(base_url: str | None = None, timeout_s: float = 2.0) -> bool:
    """Whether a Docker daemon answers ``/_ping`` (``DOCKER_HOST`` or the default socket)."""
    try:
        client = _client(base_url, timeout_s)
    except (docker.errors.DockerException, OSError):
        return False
    try:
        return bool(client.ping())
    except (docker.errors.DockerException, OSError):
        return False
    finally:
        client.close()


def _client(base_url: str | None, timeout_s: float) -> docker.DockerClient:
    if base_url is None:
        return docker.from_env(timeout=int(max(timeout_s, 1)), max_pool_size=POOL_SIZE)
    return docker.DockerClient(
        base_url=base_url, timeout=int(max(timeout_s, 1)), max_pool_size=POOL_SIZE
    )


def container_name(hostname: str, allocation_id: int) -> str:
    """``fleet-<host>-<allocation>``: one name per replica and host, so Docker itself refuses
    a second container for a replica (several agents may share one daemon, as tests do)."""
    return f"fleet-{_NAME.sub('-', hostname)[:100]}-{allocation_id}"


def gpu_request(device_uuid: str) -> dict[str, Any]:
    """The device request of ``docker run --gpus device=<uuid>[,<uuid>...]`` (a replica of
    several whole GPUs names them all, joined by commas)."""
    return {
        "Driver": "nvidia",
        "Count": 0,
        "DeviceIDs": device_uuid.split(","),
        "Capabilities": [["gpu"]],
        "Options": {},
    }


def container_config(spec: ReplicaSpec, hostname: str) -> dict[str, Any]:
    """The create parameters of one replica's container (pure: tests read them)."""
    workload = spec.workload
    labels = {
        LABEL_ALLOCATION: str(spec.allocation_id),
        LABEL_DEPLOYMENT: spec.deployment,
        LABEL_HOST: hostname,
        LABEL_GPU: spec.gpu_uuid,
        LABEL_REPLICA: str(spec.replica),
        LABEL_STOP_GRACE: str(workload["stop_grace_s"]),
    }
    host: dict[str, Any] = {"network_mode": "host", "restart_policy": {"Name": "no"}}
    if spec.gpu_request and spec.device_uuid:
        host["device_requests"] = [
            docker.types.DeviceRequest(**_snake(gpu_request(spec.device_uuid)))
        ]
    if spec.mps_pipe_directory:
        host["ipc_mode"] = "host"
        host["binds"] = {spec.mps_pipe_directory: {"bind": spec.mps_pipe_directory, "mode": "rw"}}
    return {
        "image": workload["image"],
        "command": list(workload["command"]) or None,
        "name": container_name(hostname, spec.allocation_id),
        "labels": labels,
        "environment": spec.full_environment(),
        "user": workload["user"] or "",
        "working_dir": workload["cwd"],
        "host": host,
    }


def _snake(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "driver": request["Driver"],
        "count": request["Count"],
        "device_ids": request["DeviceIDs"],
        "capabilities": request["Capabilities"],
        "options": request["Options"],
    }


class DockerRuntime:
    """Runs container workloads through the Docker Engine API (see the module docstring)."""

    name: RuntimeName = "docker"

    def __init__(self, hostname: str, base_url: str | None = None) -> None:
        self.hostname = hostname
        try:
            self._docker = _client(base_url, API_TIMEOUT_S)
            self._api = self._docker.api
            self._api.ping()
            logging_driver = self._api.info().get("LoggingDriver")
        except (docker.errors.DockerException, OSError) as exc:
            raise RuntimeUnavailable(f"no Docker daemon answers: {exc}") from exc
        self._log_config = (
            {"Type": "json-file", "Config": dict(LOG_OPTIONS)}
            if logging_driver == "json-file"
            else None
        )

    def close(self) -> None:
        """Close the connections to the daemon."""
        self._docker.close()

    # -- start and stop -------------------------------------------------------------------

    def start(self, spec: ReplicaSpec) -> Running:
        """Create and start the container, pulling the image when it is not here."""
        config = container_config(spec, self.hostname)
        self._remove_leftover(config["name"])
        try:
            try:
                container_id = self._create(config)
            except docker.errors.ImageNotFound:
                self._pull(config["image"])
                container_id = self._create(config)
        except (docker.errors.DockerException, OSError) as exc:
            raise StartError(f"cannot create the container: {_explain(exc)}") from exc
        try:
            self._api.start(container_id)
            state = self._api.inspect_container(container_id)["State"]
        except (docker.errors.DockerException, OSError) as exc:
            with contextlib.suppress(docker.errors.DockerException, OSError):
                self._api.remove_container(container_id, force=True)
            raise StartError(f"cannot start the container: {_explain(exc)}") from exc
        return self._running(container_id, config["labels"], state)

    def _create(self, config: dict[str, Any]) -> str:
        host_config = self._api.create_host_config(log_config=self._log_config, **config["host"])
        created = self._api.create_container(
            image=config["image"],
            command=config["command"],
            name=config["name"],
            labels=config["labels"],
            environment=config["environment"],
            user=config["user"],
            working_dir=config["working_dir"],
            host_config=host_config,
        )
        return str(created["Id"])

    def _pull(self, image: str) -> None:
        logger.info("pulling %s", image)
        try:
            self._docker.images.pull(image)
        except (docker.errors.DockerException, OSError) as exc:
            raise StartError(
                f"the image {image} is not on this host and cannot be pulled: {_explain(exc)}"
            ) from exc

    def _remove_leftover(self, name: str) -> None:
        """A container of this name that is not running is a leftover (an ended run, or one
        created by an agent that died before starting it): it goes. A running one is never
        replaced: the supervisor adopted it, or it is not ours to stop."""
        try:
            state = self._api.inspect_container(name)["State"]
        except docker.errors.NotFound:
            return
        except (docker.errors.DockerException, OSError) as exc:
            raise StartError(f"cannot inspect the container {name}: {_explain(exc)}") from exc
        if state.get("Status") in _RUNNING_STATES:
            raise StartError(f"a container named {name} is already running")
        with contextlib.suppress(docker.errors.NotFound):
            self._api.remove_container(name, force=True)

    def stop(self, running: Running, grace_s: float) -> Exit:
        """``docker stop -t <grace>``: SIGTERM, then SIGKILL after the grace period."""
        try:
            self._api.stop(running.ident, timeout=max(0, int(grace_s + 0.999)))
        except docker.errors.NotFound:
            return Exit(None, "the container was removed")
        return self._exit(running.ident)

    def _exit(self, container_id: str) -> Exit:
        try:
            state = self._api.inspect_container(container_id)["State"]
        except docker.errors.NotFound:
            return Exit(None, "the container was removed")
        code = state.get("ExitCode")
        message = (
            "killed: out of memory" if state.get("OOMKilled") else str(state.get("Error") or "")
        )
        return Exit(int(code) if isinstance(code, int) else None, message)

    def observe(self, running: Sequence[Running]) -> dict[str, Exit]:
        """One list request for all of this host's containers; an inspect for each that
        stopped."""
        if not running:
            return {}
        states = {c["Id"]: c.get("State", "") for c in self._list()}
        out = {}
        for r in running:
            state = states.get(r.ident)
            if state is None:
                out[r.ident] = Exit(None, "the container was removed")
            elif state not in _RUNNING_STATES:
                out[r.ident] = self._exit(r.ident)
        return out

    def _list(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._api.containers(
            all=True, filters={"label": f"{LABEL_HOST}={self.hostname}"}
        )
        return found

    # -- adoption ---------------------------------------------------------------------------

    def find(self) -> list[Found]:
        """This host's containers by label: running ones to adopt, ended ones with their exit
        code. Containers created but never started (an agent died in between) are removed."""
        found = []
        for summary in self._list():
            try:
                inspected = self._api.inspect_container(summary["Id"])
            except docker.errors.NotFound:
                continue
            state, labels = inspected["State"], inspected["Config"].get("Labels") or {}
            if not str(labels.get(LABEL_ALLOCATION, "")).isdecimal():
                continue
            if state.get("Status") == "created":
                with contextlib.suppress(docker.errors.DockerException):
                    self._api.remove_container(summary["Id"], force=True)
                continue
            running = self._running(summary["Id"], labels, state)
            ended = None if state.get("Status") in _RUNNING_STATES else self._exit(summary["Id"])
            found.append(Found(running, ended))
        return found

    def _running(self, container_id: str, labels: dict[str, str], state: dict[str, Any]) -> Running:
        grace = labels.get(LABEL_STOP_GRACE, "30")
        return Running(
            allocation_id=int(labels[LABEL_ALLOCATION]),
            runtime="docker",
            ident=container_id,
            started_at=_timestamp(state.get("StartedAt")) or time.time(),
            pid=int(state.get("Pid") or 0) or None,
            gpu_uuid=labels.get(LABEL_GPU),
            deployment=labels.get(LABEL_DEPLOYMENT, ""),
            stop_grace_s=int(grace) if grace.isdecimal() else 30,
        )

    def discard(self, running: Running) -> None:
        """Remove the ended container."""
        with contextlib.suppress(docker.errors.NotFound):
            self._api.remove_container(running.ident, force=True)

    # -- health and housekeeping -------------------------------------------------------------

    def exec_check(
        self, running: Running, spec: ReplicaSpec, command: list[str], timeout_s: float
    ) -> int:
        """``docker exec``: the check runs inside the container, with its environment."""
        try:
            created = self._api.exec_create(running.ident, command, stdout=False, stderr=False)
            self._api.exec_start(created["Id"], detach=True)
        except docker.errors.APIError:
            return 127
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = self._api.exec_inspect(created["Id"])
            if not info.get("Running"):
                code = info.get("ExitCode")
                return int(code) if isinstance(code, int) else 127
            time.sleep(_EXEC_POLL_S)
        raise TimeoutError(f"no answer within {timeout_s:g} s")

    def logs(self, allocation_id: int, tail: int) -> Output:
        """``docker logs --tail <tail>`` (stdout and stderr) of the replica's container, found
        by its name: an ended one that is not removed yet still has its output."""
        name = container_name(self.hostname, allocation_id)
        try:
            # One line more than asked: whether older output exists.
            raw = self._api.logs(name, stdout=True, stderr=True, tail=tail + 1)
        except docker.errors.NotFound:
            raise NoOutput(f"no container of allocation {allocation_id} on this host") from None
        except (docker.errors.DockerException, OSError) as exc:
            raise NoOutput(f"Docker cannot read the container's logs: {_explain(exc)}") from exc
        lines = split_lines(raw if isinstance(raw, bytes) else b"")
        if not lines:
            raise NoOutput(f"allocation {allocation_id} has written no output yet")
        return Output(lines[-tail:], len(lines) > tail)

    def maintain(self) -> None:
        """Nothing: Docker rotates the containers' logs (``LOG_OPTIONS``)."""


def _explain(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc)


def _timestamp(value: object) -> float | None:
    """Docker's RFC 3339 time with nanoseconds (``2024-05-01T10:00:00.123456789Z``) → Unix s."""
    if not isinstance(value, str) or value.startswith("0001-"):
        return None
    head, _, fraction = value.rstrip("Z").partition(".")
    try:
        whole = datetime.fromisoformat(head + "+00:00").timestamp()
    except ValueError:
        return None
    digits = "".join(c for c in fraction if c.isdecimal())[:6]
    return whole + (int(digits) / 10 ** len(digits) if digits else 0.0)
