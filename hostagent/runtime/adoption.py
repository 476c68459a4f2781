"""Adoption: what a starting agent does with the workloads it finds, and which replicas its
runtime cannot run at all.

A workload found running is taken over as it is: never started a second time, never stopped
because the control plane is not answering yet. One the saved specs know is supervised at
once (restarts, health checks); one they do not know is left alone until a desired state says
whether it is wanted (:meth:`~hostagent.runtime.supervisor.Supervisor.authorize`). A saved
replica found ended (or not found: a reboot) waits for that desired state too before it
starts again: its MIG instance may be gone with the reboot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from hostagent.protocol import RUNS_ON, AgentRuntime, WorkloadRuntime
from hostagent.runtime.base import Found, ReplicaSpec, Runtime
from hostagent.runtime.policy import Replica, describe_exit

logger = logging.getLogger(__name__)


def unsupported(
    spec: ReplicaSpec, agent_runtime: AgentRuntime, runtimes: Mapping[WorkloadRuntime, Runtime]
) -> str | None:
    """Why this agent cannot run the replica's workload, or ``None`` if it can."""
    kind = spec.workload["runtime"]
    if agent_runtime == "none":
        return f"this agent runs no workloads (--runtime none): the {kind} cannot start here"
    if agent_runtime not in RUNS_ON[kind]:
        return (
            f"a {kind} needs an agent with the docker runtime; this agent runs processes only "
            f"(--runtime {agent_runtime})"
        )
    if kind not in runtimes:
        return f"the agent's {agent_runtime} runtime is not available for a {kind}"
    return runtimes[kind].refusal


def adopt_found(
    replicas: dict[int, Replica],
    found: Iterable[Found],
    now: float,
    orphan_gpus: set[str] | None,
) -> list[Replica]:
    """Merge what a runtime found into ``replicas``; return the records touched.

    ``orphan_gpus`` is ``None`` before any desired state came; after one, a found workload no
    replica claims is an orphan when it sits on one of these GPUs (or on no known GPU).
    """
    touched = []
    for f in found:
        running, ended = f.running, f.exit
        r = replicas.get(running.allocation_id)
        if r is None:
            r = replicas[running.allocation_id] = Replica(running.allocation_id, None)
        elif r.running is not None or r.busy:
            logger.warning(
                "allocation %s runs twice (%s and %s): keeping the first",
                running.allocation_id,
                r.running.ident if r.running else "starting",
                running.ident,
            )
            continue
        if ended is None:
            _take_running(r, f, now)
        else:
            r.ended, r.exit_code = running, ended.exit_code
            r.started_at = r.started_at or running.started_at
            if r.spec is None:
                r.state, r.message = "exited", describe_exit(ended)
            elif r.hold:
                r.state = "pending"
                r.message = (
                    f"{describe_exit(ended)} while the agent was away; waiting for the control "
                    "plane's desired state"
                )
        if r.spec is None and orphan_gpus is not None and r.gpu_uuid in (*orphan_gpus, None):
            r.stop_reason = "orphan"
        logger.info(
            "adopted allocation %s (%s %s, %s)",
            r.allocation_id,
            running.runtime,
            running.ident[:12],
            "running" if ended is None else "ended",
        )
        touched.append(r)
    return touched


def _take_running(r: Replica, f: Found, now: float) -> None:
    running = f.running
    r.running, r.started_at, r.run_since, r.next_check = running, running.started_at, now, now
    if r.spec is None:
        r.state, r.message = "running", "adopted; not claimed by a desired state yet"
        return
    r.launched, r.hold = r.spec.fingerprint(), False
    r.healthy = r.spec.workload["health"] is None
    r.state = "running" if r.healthy else "starting"
    r.message = "adopted" if r.healthy else "adopted; waiting for its health check to pass"
