"""What replicas run, and what holds their slices while it stops.

A deployment's ``workload`` (:class:`hostagent.protocol.Workload`) goes to the agent in each
replica's desired allocation; the agent starts, watches and stops it and reports its state
(:func:`workloads_record`). An evicted replica whose workload may still run is not deleted: it
becomes ``releasing``, leaves the desired state (so the agent stops it) and keeps its slice
reserved until the agent says nothing runs for it any more. Only then is the slice free for
another replica: two workloads never share a slice, whatever the order of events.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from django.db import transaction
from django.utils import timezone

from fleet.allocations.models import (
    Allocation,
    AllocationState,
    Deployment,
    RequestKind,
    WorkloadState,
)
from fleet.core import alerts
from fleet.core.errors import ServiceError
from fleet.core.events import publish_changed
from fleet.core.jobs import place_queue_after_commit
from fleet.core.registry import pinned_reference
from fleet.core.secrets import env_ref_problems, env_refs
from fleet.inventory.models import AgentRuntime, Host
from hostagent import protocol

logger = logging.getLogger(__name__)

# States in which nothing runs for a replica: its slice can be released at once.
IDLE_STATES = frozenset({WorkloadState.NONE, WorkloadState.EXITED, WorkloadState.FAILED})


def workload_from_input(data: Mapping[str, Any] | None) -> protocol.Workload:
    """The full workload for an API input (missing fields at their defaults), checked by the
    protocol's own rules; :class:`ServiceError` ``workload.invalid`` names each broken field.

    An ``env`` value may be a reference to a team secret, ``{"secret": "<name>"}``: it is kept
    as given (the protocol types env values as strings; here a reference stands in for one
    until :func:`fleet.agents.documents.host_desired_state` resolves it for the agent)."""
    workload = protocol.default_workload()
    if data:
        for key, value in data.items():
            if key in workload:
                workload[key] = value  # type: ignore[literal-required]
        health = data.get("health")
        if isinstance(health, dict):
            workload["health"] = {**protocol.default_health(), **health}
    refs = _secret_refs_checked(workload)
    try:
        checked: protocol.Workload = protocol.validate(workload, protocol.Workload)
    except protocol.ProtocolError as error:
        raise ServiceError(
            "workload.invalid",
            f"The workload is not valid: {error.reason}",
            {"field": error.path.removeprefix("$.").removeprefix("$") or "workload"},
        ) from None
    problems = protocol.workload_problems(checked)
    if problems:
        raise ServiceError(
            "workload.invalid",
            f"The workload is not valid: {problems[0][1]}",
            {"problems": [{"field": field, "message": message} for field, message in problems]},
        )
    if refs:
        # The references stay in the stored workload (a value never does): only the desired
        # state of a host running a replica gets the values (fleet.agents.documents).
        checked["env"] = cast(
            dict[str, str],
            {k: {"secret": refs[k]} if k in refs else v for k, v in checked["env"].items()},
        )
    return checked


def _secret_refs_checked(workload: protocol.Workload) -> dict[str, str]:
    """The secret references of ``workload["env"]`` (``{"secret": name}``), each replaced by a
    placeholder so that the protocol's rules (string values) check the rest; a malformed one
    is a ``workload.invalid``."""
    problems = env_ref_problems(workload["env"])
    if problems:
        raise ServiceError(
            "workload.invalid",
            f"The workload is not valid: {problems[0][1]}",
            {"problems": [{"field": field, "message": message} for field, message in problems]},
        )
    refs = env_refs(workload["env"])
    if refs:
        workload["env"] = {k: "" if k in refs else v for k, v in workload["env"].items()}
    return refs


def _stored(deployment: Deployment, allocation: Allocation | None) -> Any:
    if allocation is not None and allocation.workload is not None:
        return allocation.workload
    return deployment.workload


def workload_of(deployment: Deployment, allocation: Allocation | None = None) -> protocol.Workload:
    """What the replica copy ``allocation`` runs (the one it was placed with), else the
    deployment's workload; checked again (a row edited by hand that breaks the rules runs
    nothing rather than reaching an agent)."""
    try:
        return workload_from_input(_stored(deployment, allocation))
    except ServiceError:
        logger.warning(
            "deployment %s: stored workload is not valid; running nothing", deployment.pk
        )
        return protocol.default_workload()


def workload_to_run(
    deployment: Deployment, allocation: Allocation | None = None
) -> protocol.Workload:
    """:func:`workload_of` as the agents are told it: a container's image as its pinned
    ``name@sha256:…`` when the stored workload pins that very image
    (:mod:`fleet.core.registry`), else as given (its tag)."""
    workload = workload_of(deployment, allocation)
    image = workload["image"]
    if workload["runtime"] == "container" and image:
        reference = pinned_reference(_stored(deployment, allocation), image)
        if reference is not None:
            workload["image"] = reference
    return workload


def runtime_of(deployment: Deployment, allocation: Allocation | None = None) -> str:
    stored = _stored(deployment, allocation)
    workload = stored if isinstance(stored, dict) else {}
    return str(workload.get("runtime", "none"))


def can_run(host_runtime: str, workload_runtime: str) -> bool:
    """Whether an agent with ``host_runtime`` runs a workload of ``workload_runtime``."""
    return host_runtime in protocol.RUNS_ON.get(workload_runtime, frozenset())


def allocations_release(allocations: Iterable[Allocation]) -> list[Allocation]:
    """Take replicas off their slices: delete the rows whose workload cannot be running (runtime
    ``none``, an agent that runs nothing, a state in :data:`IDLE_STATES`), mark the others
    ``releasing``. Returns those still releasing. Call under the host's row lock."""
    now = timezone.now()
    gone, held = [], []
    for allocation in allocations:
        host_runtime = allocation.gpu.host.runtime
        runs_something = runtime_of(allocation.deployment, allocation) != "none"
        if (
            not runs_something
            or host_runtime == AgentRuntime.NONE
            or allocation.workload_state in IDLE_STATES
        ):
            gone.append(allocation.pk)
        else:
            held.append(allocation)
    if gone:
        Allocation.objects.filter(pk__in=gone).delete()
        place_queue_after_commit()  # capacity freed: the queue's waiting replicas may fit
    if held:
        Allocation.objects.filter(pk__in=[a.pk for a in held]).update(
            state=AllocationState.RELEASING, released_at=now, updated_at=now
        )
        for allocation in held:
            allocation.state = AllocationState.RELEASING
            allocation.released_at = now
    return held


def host_replica_spans(host_id: int) -> dict[int, list[int]]:
    """The replicas of several whole GPUs on the host: their first GPU's allocation (the one
    that runs the workload) → every allocation of the replica, in slot order. One query.

    A copy being released and a copy placed of the same replica are told apart (by state), as
    are a move's two copies (the new one's allocations each name the one they replace)."""
    rows = (
        Allocation.objects.filter(
            gpu__host_id=host_id, kind=RequestKind.GPU, deployment__gpu_count__gt=1
        )
        .order_by("deployment_id", "replica", "gpu_slot", "pk")
        .values_list("pk", "deployment_id", "replica", "replaces_id", "state")
    )
    groups: dict[tuple[int, int, bool, bool], list[int]] = {}
    for pk, deployment_id, replica, replaces_id, state in rows:
        new_copy = replaces_id is not None
        key = (deployment_id, replica, new_copy, state == AllocationState.RELEASING)
        groups.setdefault(key, []).append(pk)
    return {pks[0]: pks for pks in groups.values() if len(pks) > 1}


@dataclass(frozen=True)
class Recorded:
    changed: list[int]
    released: list[int]


_STATUS_FIELDS = ("workload_state", "started_at", "exit_code", "restarts", "workload_message")


@transaction.atomic
def workloads_record(
    *, host_id: int, statuses: list[protocol.WorkloadStatus], full: bool
) -> Recorded:
    """Store what a host's agent reports about its replicas' workloads.

    Only the host's own allocations are touched (an id of another host's is ignored). A
    releasing replica reported ``none`` (or missing from a ``full`` report) is deleted: its
    slice is free. A replica of several whole GPUs runs from its first GPU's allocation: the
    others take that one's state and are freed with it, never before (its workload uses their
    GPUs until it stops). Locks the host row first, as placements and evictions do (after the
    deployment, which this never locks), so the two cannot deadlock.
    """
    Host.objects.select_for_update().filter(pk=host_id).first()
    by_id = {s["allocation_id"]: s for s in statuses}
    spans = host_replica_spans(host_id)
    lead_of = {pk: lead for lead, pks in spans.items() for pk in pks[1:]}
    for pk, lead in lead_of.items():
        if lead in by_id:
            by_id[pk] = {**by_id[lead], "allocation_id": pk}
        else:
            by_id.pop(pk, None)  # not the one that runs: what the agent says of it is moot
    query = Allocation.objects.select_for_update().filter(gpu__host_id=host_id)
    if not full:
        query = query.filter(pk__in=list(by_id))
    rows = list(
        query.only(
            "pk",
            "state",
            "deployment_id",
            "gpu_id",
            "replica",
            "workload",
            "ports",
            *_STATUS_FIELDS,
        )
    )
    ported = _ports_checked(host_id, rows, by_id)
    changed: list[Allocation] = []
    released: list[Allocation] = []
    crashlooping: list[Allocation] = []
    for row in rows:
        status = by_id.get(row.pk)
        releasing = row.state == AllocationState.RELEASING
        if releasing and (status is None or status["state"] == "none"):
            released.append(row)
        elif status is not None:
            was = row.workload_state
            if _apply(row, status, ported.get(row.pk, row.ports)):
                changed.append(row)
                if row.workload_state == WorkloadState.CRASHLOOP != was:
                    crashlooping.append(row)
    now = timezone.now()
    for row in changed:
        row.updated_at = now
    if changed:
        Allocation.objects.bulk_update(changed, [*_STATUS_FIELDS, "ports", "updated_at"])
    if released:
        Allocation.objects.filter(pk__in=[r.pk for r in released]).delete()
        logger.info(
            "host %s: %d slice(s) released, their workloads stopped", host_id, len(released)
        )
        deployments = sorted({r.deployment_id for r in released})
        transaction.on_commit(lambda: deployments_finalize(deployments), robust=True)
        place_queue_after_commit()  # capacity freed: the queue's waiting replicas may fit
    _alert_crashloops(crashlooping)
    publish_changed("gpu", [r.gpu_id for r in (*changed, *released)])
    publish_changed("allocation", [r.pk for r in changed])
    publish_changed("deployment", [r.deployment_id for r in (*changed, *released)])
    return Recorded(changed=[r.pk for r in changed], released=[r.pk for r in released])


def _alert_crashloops(rows: list[Allocation]) -> None:
    if not rows:
        return
    names = dict(
        Deployment.objects.filter(pk__in={r.deployment_id for r in rows}).values_list("pk", "name")
    )
    for row in rows:
        name = names.get(row.deployment_id, str(row.deployment_id))
        replica = row.replica
        alerts.alert_emit(
            event=alerts.REPLICA_CRASHLOOP,
            summary=f"{name}[{replica}] is in a crash loop after {row.restarts} restarts: "
            f"{row.workload_message}",
            subject={
                "deployment": {"id": row.deployment_id, "name": name},
                "replica": replica,
                "allocation": {"id": row.pk},
                "gpu": {"id": row.gpu_id},
            },
        )


def _ports_checked(
    host_id: int, rows: list[Allocation], by_id: Mapping[int, protocol.WorkloadStatus]
) -> dict[int, dict[str, int]]:
    """The host ports to store per allocation that reports some: only names its workload
    declares, no port another replica of the host holds (what the agent says is checked, not
    trusted: a refused report of ports is logged and changes nothing)."""
    reporting = [r for r in rows if "ports" in by_id.get(r.pk, {})]
    if not reporting:
        return {}
    taken = {
        port: pk
        for pk, ports in Allocation.objects.filter(gpu__host_id=host_id).values_list("pk", "ports")
        if isinstance(ports, dict)
        for port in ports.values()
    }
    deployments = Deployment.objects.in_bulk({r.deployment_id for r in reporting})
    accepted: dict[int, dict[str, int]] = {}
    for row in reporting:
        reported = dict(by_id[row.pk]["ports"])
        declared = protocol.declared_ports(workload_of(deployments[row.deployment_id], row))
        others = {port: pk for port, pk in taken.items() if pk != row.pk}
        problem = protocol.report_port_problems(reported, declared, others)
        if problem is not None:
            logger.warning("host %s, allocation %s: ports refused: %s", host_id, row.pk, problem)
            continue
        accepted[row.pk] = reported
        taken = {**others, **dict.fromkeys(reported.values(), row.pk)}
    return accepted


def _apply(row: Allocation, status: protocol.WorkloadStatus, ports: Any) -> bool:
    started = status["started_at"]
    values: dict[str, Any] = {
        "ports": ports,
        "workload_state": status["state"],
        "started_at": datetime.fromtimestamp(started, tz=UTC) if started is not None else None,
        "exit_code": status["exit_code"],
        "restarts": status["restarts"],
        "workload_message": status["message"][:256],
    }
    if all(getattr(row, name) == value for name, value in values.items()):
        return False
    for name, value in values.items():
        setattr(row, name, value)
    return True


@transaction.atomic
def deployments_finalize(deployment_ids: list[int]) -> list[int]:
    """Delete the deployments being deleted that hold no slice any more; returns their ids."""
    done = []
    for deployment in Deployment.objects.select_for_update().filter(
        pk__in=deployment_ids, deleting=True
    ):
        if not deployment.allocations.exists():
            done.append(deployment.pk)
            deployment.delete()
    if done:
        publish_changed("deployment", done)
    return done
