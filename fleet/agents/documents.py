"""Reads on desired state: the per-host document an agent must realise.

It is the one place a team secret's value leaves the database: a replica's workload refers to
its team's secrets by name, and the document for the host that runs it carries the values
(decrypted here, named in ``secret_env``). It is built for each push and sent, never stored.
"""

from __future__ import annotations

import logging

from fleet.allocations.models import Allocation, Deployment, RequestKind
from fleet.allocations.workloads import host_replica_spans, workload_to_run
from fleet.autoscaling.models import Metric, ScalingPolicy
from fleet.core.policy import effective_policy, workload_security
from fleet.core.secrets import env_refs, team_secret_values
from fleet.endpoints.models import Endpoint
from fleet.inventory.models import Host, SharingMode
from fleet.partitioning import converters
from fleet.partitioning.models import Partition, PartitionKind
from hostagent import protocol

logger = logging.getLogger(__name__)


def partition_key(partition: Partition) -> str:
    """The stable key of a partition in the desired-state document."""
    if partition.kind == PartitionKind.MIG:
        return f"p{partition.pk}:{partition.profile_id}@{partition.start}"
    return f"p{partition.pk}:gpu"


def _mps(partition: Partition | None, *, per_instance: bool) -> protocol.DesiredMps:
    """A partition's MPS policy on the wire (the agent sets the daemon's defaults from it)."""
    policy = converters.mps_policy(partition) if partition and partition.mps_enabled else None
    return {
        "enabled": policy is not None,
        "per_instance": per_instance,
        "default_active_thread_percentage": policy.default_active_thread_percentage
        if policy
        else None,
        "default_pinned_mem_limit_mib": policy.default_pinned_mem_limit_mib if policy else None,
    }


def _drain_s(deployment: Deployment) -> int:
    """Its endpoint's drain (select_related with the allocations); 0 without an endpoint."""
    try:
        return int(deployment.endpoint.drain_s)
    except Endpoint.DoesNotExist:
        return 0


def _scrape(deployment: Deployment) -> protocol.Scrape | None:
    """What its agent reads of each replica for its autoscaling policy (select_related with the
    allocations); ``None`` unless the policy tracks the replicas' own metric."""
    try:
        policy: ScalingPolicy = deployment.autoscaling
    except ScalingPolicy.DoesNotExist:
        return None
    if policy.metric != Metric.REPLICA_METRIC or not policy.metric_name:
        return None
    return {
        "port": policy.metric_port,
        "path": policy.metric_path or "/metrics",
        "names": [policy.metric_name],
    }


def _security(allocation: Allocation, workload: protocol.Workload) -> protocol.Security:
    """How the replica's workload is confined: its team's policy, applied
    (:func:`fleet.core.policy.workload_security`)."""
    deployment = allocation.deployment
    policy = effective_policy(deployment.team.policy)
    return workload_security(policy, workload, deployment.host_memory_mib)


def _resolve_secrets(
    allocation: Allocation,
    desired: protocol.DesiredAllocation,
    known: dict[int, dict[str, str]],
) -> None:
    """Replace the workload's secret references by their values and name them in
    ``secret_env`` (``known``: the values decrypted so far, per team). A reference its team
    cannot resolve (a secret deleted, or one no key opens) runs nothing, rather than a workload
    without its secret."""
    refs = env_refs(desired["workload"]["env"])
    if not refs:
        return
    team_id = allocation.deployment.team_id
    values = known.setdefault(team_id, {})
    values.update(team_secret_values(team_id, set(refs.values()) - set(values)))
    unresolved = sorted(set(refs.values()) - set(values))
    if unresolved:
        logger.warning(
            "allocation %s: secret(s) %s of team %s cannot be read; running nothing",
            allocation.pk,
            ", ".join(unresolved),
            team_id,
        )
        desired["workload"] = protocol.default_workload()
        return
    env = desired["workload"]["env"]
    desired["workload"] = {
        **desired["workload"],
        "env": {key: values[refs[key]] if key in refs else value for key, value in env.items()},
    }
    desired["secret_env"] = sorted(refs)


def host_desired_state(host: Host) -> protocol.DesiredState:
    """Generation ``host.desired_generation`` of the host's desired state, built from the rows."""
    gpus: dict[str, protocol.DesiredGpu] = {}
    partitions = (
        Partition.objects.filter(gpu__host=host).select_related("gpu").order_by("gpu_id", "start")
    )
    allocations = (
        Allocation.objects.placed()  # a releasing replica is left out: the agent stops it
        .filter(gpu__host=host)
        .select_related(
            "deployment__team",
            "deployment__endpoint",
            "deployment__autoscaling",
            "partition",
            "gpu",
        )
        .order_by("deployment_id", "replica", "gpu_slot")
    )
    by_gpu: dict[int, list[Partition]] = {}
    for partition in partitions:
        by_gpu.setdefault(partition.gpu_id, []).append(partition)
    for gpu in host.gpus.all().order_by("index"):
        parts = by_gpu.get(gpu.pk, [])
        whole = next((p for p in parts if p.kind == PartitionKind.GPU), None)
        mig_parts = [p for p in parts if p.kind == PartitionKind.MIG]
        gpus[gpu.uuid] = {
            "mode": gpu.mode,  # type: ignore[typeddict-item]
            "mig_enabled": gpu.mode == SharingMode.MIG,
            # Each MIG instance says whether an MPS daemon runs inside it, with its own limits.
            "instances": [
                {
                    "key": partition_key(p),
                    "profile_id": int(p.profile_id or 0),
                    "start": p.start,
                    "mps": _mps(p, per_instance=True),
                }
                for p in mig_parts
            ],
            "mps": _mps(whole, per_instance=False),
            "allocations": [],
        }
    # A replica of several whole GPUs: one workload, from its first GPU, that sees them all.
    spans = host_replica_spans(host.pk)
    followers = {pk for pks in spans.values() for pk in pks[1:]}
    uuids = {a.pk: a.gpu.uuid for a in allocations}
    secrets: dict[int, dict[str, str]] = {}
    for allocation in allocations:
        entry = gpus.get(allocation.gpu.uuid)
        if entry is None:
            continue
        desired: protocol.DesiredAllocation = {
            "key": f"a{allocation.pk}:{allocation.deployment.name}[{allocation.replica}]",
            "gpu_uuid": allocation.gpu.uuid,
            "partition_key": partition_key(allocation.partition)
            if allocation.partition.kind == PartitionKind.MIG
            else None,
            "memory_mib": allocation.memory_mib if allocation.kind == RequestKind.MPS else None,
            "max_compute_percent": allocation.compute_percent,
            "allocation_id": allocation.pk,
            "deployment": allocation.deployment.name,
            "replica": allocation.replica,
            "workload": workload_to_run(allocation.deployment, allocation),
        }
        drain = _drain_s(allocation.deployment)
        if drain:
            desired["drain_s"] = drain
        if allocation.pk in followers:
            desired["workload"] = protocol.default_workload()
        elif allocation.pk in spans:
            devices = [uuids[pk] for pk in spans[allocation.pk] if pk in uuids]
            if len(devices) > 1:
                desired["devices"] = devices
        _resolve_secrets(allocation, desired, secrets)
        if desired["workload"]["runtime"] != "none":
            desired["security"] = _security(allocation, desired["workload"])
            scrape = _scrape(allocation.deployment)
            if scrape is not None:
                desired["scrape"] = scrape
        entry["allocations"].append(desired)
    return {"type": "desired_state", "generation": int(host.desired_generation), "gpus": gpus}
