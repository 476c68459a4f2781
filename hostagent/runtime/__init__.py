"""The agent runs the replicas' workloads: containers through the Docker Engine API, or process
groups, each on its slice with the environment Fleet gives it.

Layout, kept apart like :mod:`hostagent.gpu`:

* :mod:`.base`: the :class:`Runtime` protocol and the values passed around;
* :mod:`.docker` (the only module importing ``docker``) and :mod:`.process`: the runtimes;
* :mod:`.policy` (pure: restart policy, backoff, crashloop, health), :mod:`.health` (the
  checks), :mod:`.adoption`, :mod:`.store` and :mod:`.supervisor`: what runs, and why;
* :mod:`.sync`: between a desired state and the supervisor (devices, environment, order);
* :mod:`.procfs`: PIDs, sessions and PID namespaces, for adoption and process attribution.

Which runtime an agent uses (``--runtime``): ``docker`` runs containers and processes,
``process`` processes only, ``none`` nothing (the slices are only reserved). By default,
``docker`` when a Docker daemon answers, else ``process``. Either way, process workloads
start only on an agent started with ``--allow-process-runtime`` (review H1, as Nomad's
``raw_exec`` is off by default); the others report them ``failed`` and say so.
"""

from __future__ import annotations

from pathlib import Path

from hostagent.protocol import AgentRuntime, WorkloadRuntime
from hostagent.runtime.base import (
    IMAGE_PULLS,
    PROCESS_RUNTIME_OFF,
    Exit,
    Found,
    ImagePull,
    ReplicaSpec,
    Running,
    Runtime,
    RuntimeUnavailable,
    StartError,
)
from hostagent.runtime.cgroups import Cgroups
from hostagent.runtime.policy import Timing
from hostagent.runtime.process import ProcessRuntime
from hostagent.runtime.supervisor import Supervisor
from hostagent.runtime.sync import WorkloadSync, replica_specs


def docker_answers() -> bool:
    """Whether a Docker daemon answers on ``DOCKER_HOST`` or the default socket."""
    # Loaded here, not at the top: an agent that runs processes never imports ``docker``.
    from hostagent.runtime.docker import docker_answers as answers

    return answers()


def default_runtime() -> AgentRuntime:
    """``docker`` when a Docker daemon answers, else ``process``."""
    return "docker" if docker_answers() else "process"


def build_runtimes(
    agent_runtime: AgentRuntime,
    *,
    hostname: str,
    state_dir: Path,
    allow_process: bool = False,
    process_as_agent_user: bool = False,
    cgroups: Cgroups | None = None,
    image_pull: ImagePull = "always",
    network: str = "fleet",
    publish_address: str = "127.0.0.1",
) -> dict[WorkloadRuntime, Runtime]:
    """The runtimes of an agent: containers and processes with ``docker``, processes with
    ``process``, nothing with ``none``. Without ``allow_process`` the process runtime starts
    nothing (it still finds and stops what an earlier agent started).

    Raises:
        RuntimeUnavailable: ``docker`` was asked for and no Docker daemon answers.
    """
    if agent_runtime == "none":
        return {}
    process = ProcessRuntime(
        state_dir,
        allow_start=allow_process,
        as_agent_user=process_as_agent_user,
        cgroups=cgroups,
    )
    runtimes: dict[WorkloadRuntime, Runtime] = {"process": process}
    if agent_runtime == "docker":
        from hostagent.runtime.docker import DockerRuntime  # see docker_answers

        runtimes["container"] = DockerRuntime(
            hostname, image_pull=image_pull, network=network, publish_address=publish_address
        )
    return runtimes


__all__ = [
    "IMAGE_PULLS",
    "PROCESS_RUNTIME_OFF",
    "Cgroups",
    "Exit",
    "Found",
    "ImagePull",
    "ProcessRuntime",
    "ReplicaSpec",
    "Running",
    "Runtime",
    "RuntimeUnavailable",
    "StartError",
    "Supervisor",
    "Timing",
    "WorkloadSync",
    "build_runtimes",
    "default_runtime",
    "docker_answers",
    "replica_specs",
]
