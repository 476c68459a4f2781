"""The Docker runtime: each replica is one container, through the Docker Engine API.

This is the only module that imports the ``docker`` package (an import-linter contract says
so), as :mod:`hostagent.gpu.nvml` is for NVML. What every container gets, and why:

* the labels ``fleet.allocation``, ``fleet.deployment`` and ``fleet.host`` (plus the GPU and
  the stop grace period): a restarted agent finds its containers by label, never by name;
* Kubernetes' ``restricted`` profile (review H3), from the replica's ``security``: every
  capability dropped (``cap_add`` adds back what the team's policy allows),
  ``no-new-privileges``, a PID limit and the host memory limit, a non-root user (uid 0 only
  when ``allow_root``; with no ``user``, the image's own user, refused when it is root);
* no network (``none``) for a container that declares no ports; one that does joins the
  agent's user-defined bridge network (``--container-network``, ``fleet``; created when
  missing, with inter-container traffic off where Docker enforces it), unless the policy gives
  the host's (``host_network``). Each declared port is published on the replica's own host
  port (:mod:`hostagent.runtime.ports`) at ``--publish-address``; with ``dockerd
  --iptables=false`` Docker's userland proxy (``docker-proxy``) carries it. The health checks
  go to the container's own address on that network, not through the proxy: the proxy accepts
  a connection even when nothing listens behind it. A private IPC namespace; no restart
  policy of Docker's own: the agent counts restarts, backs off and says ``crashloop``;
* the image pulled before every create (``--image-pull always``, Kubernetes'
  ``AlwaysPullImages``): an image pulled once for one team does not run for another without
  the registry's say. When the pull fails, a local image is used only if the reference pins
  its digest (``@sha256:``) and the local image has it. ``if-not-present`` (tests, air-gapped
  hosts with locally built images) pulls only what is missing;
* on the NVML backend, the device request ``docker run --gpus device=<uuid>`` sends (driver
  ``nvidia``, capabilities ``[["gpu"]]``, the MIG or GPU UUID); none on the simulated backend;
* for an MPS share, ``ipc=host`` and the daemon's pipe directory mounted read-only at the same
  path, as the MPS client inside must reach the host's daemon (MPS doc, "Containers").
  Read-only is enough: a client ``connect()``s to the daemon's Unix sockets, which needs write
  permission on the socket inode (its mode), not a writable mount: the kernel's read-only
  check (``sb_permission``, ``EROFS``) covers regular files, directories and links only, and
  a read-only bind mount is enforced where something is created or written
  (``mnt_want_write``), which ``connect()`` never calls. What it stops is the container
  creating, replacing or removing the daemon's sockets and log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import docker
import docker.errors
import docker.types

from hostagent.protocol import (
    DEFAULT_STOP_GRACE_S,
    LABEL_ALLOCATION,
    LABEL_DEPLOYMENT,
    LABEL_HOST,
    declared_ports,
)
from hostagent.runtime.base import (
    Exit,
    Found,
    ImagePull,
    ReplicaSpec,
    Running,
    RuntimeName,
    RuntimeUnavailable,
    StartError,
)
from hostagent.runtime.output import NoOutput, Output, split_lines
from hostagent.runtime.ports import DEFAULT_NETWORK, DEFAULT_PUBLISH_ADDRESS

logger = logging.getLogger(__name__)

LABEL_GPU = "fleet.gpu"
LABEL_STOP_GRACE = "fleet.stop-grace-s"
LABEL_REPLICA = "fleet.replica"
LABEL_PORTS = "fleet.host-ports"
"""The replica's host ports, as JSON (``{"http": 20001}``): an adoption without the replica
store still knows them."""
NETWORK_OPTIONS = {"com.docker.network.bridge.enable_icc": "false"}
"""Replicas of different teams share the network: no traffic between containers, where
Docker's iptables rules enforce it (``dockerd --iptables=false`` enforces nothing)."""
API_TIMEOUT_S = 60
"""Per request; a stop adds its grace period, a pull has none (docker-py does both)."""
POOL_SIZE = 16
"""Connections to the daemon: the supervisor's workers and its watcher call at once."""
LOG_OPTIONS = {"max-size": "10m", "max-file": "2"}
"""Rotation for containers logged by ``json-file`` (Docker's default keeps logs forever)."""
_EXEC_POLL_S = 0.05
_NAME = re.compile(r"[^a-zA-Z0-9_.-]")
_RUNNING_STATES = ("running", "restarting", "paused")
_ROOT_USERS = ("", "root", "0")
ROOT_IMAGE = (
    "the image runs as root; set workload.user to a non-root uid, or ask an admin to allow root"
)


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


def container_config(
    spec: ReplicaSpec,
    hostname: str,
    network: str = DEFAULT_NETWORK,
    publish_address: str = DEFAULT_PUBLISH_ADDRESS,
) -> dict[str, Any]:
    """The create parameters of one replica's container (pure: tests read them).

    Raises:
        StartError: the replica's ``user`` is root and its policy does not allow root, or it
            declares ports and has no host ports yet.
    """
    workload, security = spec.workload, spec.confinement()
    user = security["user"] or ""
    if user and is_root_user(user) and not security["allow_root"]:
        raise StartError(
            f"refusing to run the container as root ({user!r}): set workload.user to a "
            "non-root uid, or ask an admin to allow root"
        )
    published = _published(spec, publish_address)
    labels = {
        LABEL_ALLOCATION: str(spec.allocation_id),
        LABEL_DEPLOYMENT: spec.deployment,
        LABEL_HOST: hostname,
        LABEL_GPU: spec.gpu_uuid,
        LABEL_REPLICA: str(spec.replica),
        LABEL_STOP_GRACE: str(workload["stop_grace_s"]),
        LABEL_PORTS: json.dumps(spec.host_ports, sort_keys=True),
    }
    host: dict[str, Any] = {
        "network_mode": _network_mode(spec, network),
        "port_bindings": published,
        "ipc_mode": "private",
        "restart_policy": {"Name": "no"},
        "cap_drop": ["ALL"],
        "cap_add": list(security["cap_add"]),
        "security_opt": ["no-new-privileges"],
        "pids_limit": security["pids_limit"],
    }
    if security["memory_mib"] is not None:
        host["mem_limit"] = security["memory_mib"] * 2**20
        host["memswap_limit"] = host["mem_limit"]  # no swap beyond the limit
    if spec.gpu_request and spec.device_uuid:
        host["device_requests"] = [
            docker.types.DeviceRequest(**_snake(gpu_request(spec.device_uuid)))
        ]
    if spec.mps_pipe_directory:
        host["ipc_mode"] = "host"  # the MPS client and server share memory through host IPC
        host["binds"] = {spec.mps_pipe_directory: {"bind": spec.mps_pipe_directory, "mode": "ro"}}
    return {
        "image": workload["image"],
        "command": list(workload["command"]) or None,
        "name": container_name(hostname, spec.allocation_id),
        "labels": labels,
        "environment": spec.full_environment(),
        "user": user,
        "working_dir": workload["cwd"],
        "ports": sorted(int(key.partition("/")[0]) for key in published),
        "host": host,
    }


def _network_mode(spec: ReplicaSpec, network: str) -> str:
    """The host's network where the policy gives it, the agent's bridge network for a
    container that declares ports, else none at all (it serves nothing)."""
    if spec.confinement()["host_network"]:
        return "host"
    return network if declared_ports(spec.workload) else "none"


def _published(spec: ReplicaSpec, address: str) -> dict[str, tuple[str, int]]:
    """``docker run -p <address>:<host port>:<port>`` of each declared port of a bridged
    container (none in the host's network: it binds its ports itself)."""
    if not spec.bridged():
        return {}
    declared = declared_ports(spec.workload)
    missing = [p["name"] for p in declared if p["name"] not in spec.host_ports]
    if missing:
        raise StartError(f"no host port for {', '.join(missing)} yet")
    return {f"{p['port']}/tcp": (address, spec.host_ports[p["name"]]) for p in declared}


def is_root_user(user: str) -> bool:
    """Whether a Docker ``user`` (``name``, ``uid``, ``name:group``, ``uid:gid``; empty: the
    image's default) means uid 0: empty, ``root`` or ``0``, whatever the group."""
    name = user.partition(":")[0].strip()
    return name in _ROOT_USERS or (name.isdecimal() and int(name) == 0)


def pinned_digest(image: str) -> str | None:
    """The ``sha256:…`` an image reference pins (``repo@sha256:…``), else ``None``."""
    _, at, digest = image.partition("@")
    return digest if at and digest.startswith("sha256:") else None


def _snake(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "driver": request["Driver"],
        "count": request["Count"],
        "device_ids": request["DeviceIDs"],
        "capabilities": request["Capabilities"],
        "options": request["Options"],
    }


class DockerRuntime:
    """Runs container workloads through the Docker Engine API (see the module docstring).

    ``image_pull``: ``always`` (the default) pulls before every create; ``if-not-present``
    only when the image is not on this host (tests and locally built images).
    """

    name: RuntimeName = "docker"
    refusal: str | None = None

    def __init__(
        self,
        hostname: str,
        base_url: str | None = None,
        image_pull: ImagePull = "always",
        *,
        network: str = DEFAULT_NETWORK,
        publish_address: str = DEFAULT_PUBLISH_ADDRESS,
    ) -> None:
        self.hostname = hostname
        self.image_pull = image_pull
        self.network = network
        self.publish_address = publish_address
        self._network_ready = False
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
        """Pull the image (see ``image_pull``), check its user, create and start the
        container."""
        config = container_config(spec, self.hostname, self.network, self.publish_address)
        if config["host"]["network_mode"] == self.network:
            self._ensure_network()
        self._remove_leftover(config["name"])
        image = self._image(config["image"])
        if not config["user"] and not spec.confinement()["allow_root"]:
            configured = str((image.get("Config") or {}).get("User") or "")
            if is_root_user(configured):
                raise StartError(ROOT_IMAGE)
        try:
            container_id = self._create(config)
        except (docker.errors.DockerException, OSError) as exc:
            raise StartError(f"cannot create the container: {_explain(exc)}") from exc
        try:
            self._api.start(container_id)
            inspected = self._api.inspect_container(container_id)
        except (docker.errors.DockerException, OSError) as exc:
            with contextlib.suppress(docker.errors.DockerException, OSError):
                self._api.remove_container(container_id, force=True)
            raise StartError(f"cannot start the container: {_explain(exc)}") from exc
        return self._running(container_id, config["labels"], inspected)

    def _ensure_network(self) -> None:
        """Create the bridge network when it is missing (once per agent; when a racing agent
        created it first, that one is used)."""
        if self._network_ready:
            return
        try:
            if not self._network_exists():
                try:
                    self._api.create_network(
                        self.network,
                        driver="bridge",
                        options=dict(NETWORK_OPTIONS),
                        labels={LABEL_HOST: self.hostname},
                        check_duplicate=True,
                    )
                except docker.errors.APIError:
                    if not self._network_exists():
                        raise
                logger.info("created the Docker network %s", self.network)
            self._dedupe_network()
        except (docker.errors.DockerException, OSError) as exc:
            raise StartError(
                f"cannot create the Docker network {self.network}: {_explain(exc)}"
            ) from exc
        self._network_ready = True

    def _image(self, image: str) -> dict[str, Any]:
        """The image to run, inspected, as the pull policy says (see the module docstring)."""
        local = self._inspect_image(image)
        if local is not None and self.image_pull == "if-not-present":
            return local
        try:
            self._pull(image)
        except StartError:
            digest = pinned_digest(image)
            if local is None or digest is None or not _has_digest(local, digest):
                raise
            logger.warning("cannot pull %s; its pinned digest is here: using it", image)
            return local
        pulled = self._inspect_image(image)
        if pulled is None:
            raise StartError(f"the image {image} was pulled but cannot be found")
        return pulled

    def _inspect_image(self, image: str) -> dict[str, Any] | None:
        try:
            inspected: dict[str, Any] = self._api.inspect_image(image)
        except docker.errors.NotFound:  # ImageNotFound included
            return None
        except (docker.errors.DockerException, OSError) as exc:
            raise StartError(f"cannot inspect the image {image}: {_explain(exc)}") from exc
        return inspected

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
            ports=config["ports"] or None,
            host_config=host_config,
        )
        return str(created["Id"])

    def _pull(self, image: str) -> None:
        logger.info("pulling %s", image)
        try:
            self._docker.images.pull(image)
        except (docker.errors.DockerException, OSError) as exc:
            raise StartError(f"cannot pull the image {image}: {_explain(exc)}") from exc

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
            running = self._running(summary["Id"], labels, inspected)
            ended = None if state.get("Status") in _RUNNING_STATES else self._exit(summary["Id"])
            found.append(Found(running, ended))
        return found

    def _running(
        self, container_id: str, labels: dict[str, str], inspected: dict[str, Any]
    ) -> Running:
        state = inspected.get("State") or {}
        grace = labels.get(LABEL_STOP_GRACE, "30")
        return Running(
            allocation_id=int(labels[LABEL_ALLOCATION]),
            runtime="docker",
            ident=container_id,
            started_at=_timestamp(state.get("StartedAt")) or time.time(),
            pid=int(state.get("Pid") or 0) or None,
            gpu_uuid=labels.get(LABEL_GPU),
            deployment=labels.get(LABEL_DEPLOYMENT, ""),
            stop_grace_s=int(grace) if grace.isdecimal() else DEFAULT_STOP_GRACE_S,
            host_ports=_label_ports(labels.get(LABEL_PORTS)),
            address=self._address(inspected),
        )

    def _dedupe_network(self) -> None:
        """Keep one network of the name. The Engine does not refuse a second network of a name
        (API 1.44 ignores ``CheckDuplicate``), so two agents that raced to create it made two,
        and a container then cannot join either ("network fleet is ambiguous"). The oldest
        stays; the others go (an agent that raced here removes the same ones: idempotent)."""
        found = [
            n for n in self._api.networks(names=[self.network]) if n.get("Name") == self.network
        ]
        if len(found) < 2:
            return
        found.sort(key=lambda n: (str(n.get("Created", "")), str(n.get("Id", ""))))
        for extra in found[1:]:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                self._api.remove_network(extra["Id"])
                logger.warning(
                    "removed a duplicate Docker network %s (%s)", self.network, extra["Id"][:12]
                )

    def _network_exists(self) -> bool:
        # ``names`` filters by substring: ``fleet`` finds ``fleet-test`` too.
        found = self._api.networks(names=[self.network])
        return any(n.get("Name") == self.network for n in found)

    def _address(self, inspected: dict[str, Any]) -> str | None:
        """The container's IP on the agent's network (``None`` in the host's network)."""
        networks = (inspected.get("NetworkSettings") or {}).get("Networks") or {}
        ip = (networks.get(self.network) or {}).get("IPAddress")
        return str(ip) if ip else None

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

    def logs(self, allocation_id: int, tail: int, *, before: int | None = None) -> Output:
        """``docker logs --timestamps --tail <tail>`` (stdout and stderr) of the replica's
        container, found by its name: an ended one that is not removed yet still has its
        output. Docker stamps each line as its logging driver takes it; Docker keeps the
        output, so there is no cursor (``seqs``): ``before`` is not served."""
        name = container_name(self.hostname, allocation_id)
        try:
            # One line more than asked: whether older output exists.
            raw = self._api.logs(name, stdout=True, stderr=True, tail=tail + 1, timestamps=True)
        except docker.errors.NotFound:
            raise NoOutput(f"no container of allocation {allocation_id} on this host") from None
        except (docker.errors.DockerException, OSError) as exc:
            raise NoOutput(f"Docker cannot read the container's logs: {_explain(exc)}") from exc
        stamped = [
            _docker_stamp(line) for line in split_lines(raw if isinstance(raw, bytes) else b"")
        ]
        if not stamped:
            raise NoOutput(f"allocation {allocation_id} has written no output yet")
        older = len(stamped) > tail
        stamped = stamped[-tail:]
        return Output([line for _, line in stamped], older, [ts for ts, _ in stamped])

    def capture(self) -> None:
        """Nothing: Docker stamps and keeps the containers' output."""

    def maintain(self) -> None:
        """Nothing: Docker rotates the containers' logs (``LOG_OPTIONS``)."""


def _has_digest(image: dict[str, Any], digest: str) -> bool:
    """Whether an inspected image is the one ``digest`` names (its ``RepoDigests`` carry the
    registry manifest's digest, ``Id`` the local config's)."""
    repo_digests = image.get("RepoDigests") or []
    return image.get("Id") == digest or any(
        str(d).partition("@")[2] == digest for d in repo_digests
    )


def _label_ports(value: str | None) -> dict[str, int]:
    """The host ports a container's label says (a label is the container's, not ours: an
    unreadable one says none)."""
    try:
        ports = json.loads(value or "{}")
    except ValueError:
        return {}
    if not isinstance(ports, dict):
        return {}
    return {str(k): v for k, v in ports.items() if isinstance(v, int) and 1 <= v <= 65535}


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


def _docker_stamp(line: str) -> tuple[float | None, str]:
    """A ``--timestamps`` line (``2026-12-04T15:40:42.123456789Z text``) as (Unix seconds,
    text); a line without a stamp Docker wrote is kept whole, unstamped."""
    stamp, sep, text = line.partition(" ")
    if not sep or not stamp.endswith("Z") or "T" not in stamp:
        return None, line
    whole, _, fraction = stamp[:-1].partition(".")
    try:
        seconds = datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None, line
    digits = (fraction or "0")[:6]
    return seconds + (int(digits) / 10 ** len(digits) if digits.isdigit() else 0.0), text
