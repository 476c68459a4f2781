"""Discovery: what an agent's hello (and an ack's ``observed``) says about its GPUs.

New GPUs are adopted as they are (their MIG instances become partitions, if the GPU allows that
layout), known ones are updated, and a GPU's NVML status drives the health workflow. Every
function takes the ``Host`` its token authenticated; a GPU is only ever looked up within that
host, so an agent can never read or write another host's state.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from fleet.agents import gpu_maps
from fleet.allocations.workloads import workloads_record
from fleet.core.errors import ServiceError
from fleet.core.events import publish_changed
from fleet.core.models import FINAL_STATUSES, Operation
from fleet.core.ratelimit import OncePer, cut
from fleet.inventory.models import (
    AgentRuntime,
    Gpu,
    GpuHealth,
    HealthEvent,
    HealthEventKind,
    Host,
    HostStatus,
    SharingMode,
)
from fleet.mig import Instance, Placement, Product, find_product, validate_layout
from fleet.partitioning.models import Partition, PartitionKind
from fleet.workflows.health import gpu_mark_unhealthy, gpu_recover
from hostagent import protocol

logger = logging.getLogger(__name__)

# A host reporting another host's GPU is recorded in the events once per this, per GPU.
CONFLICT_EVERY = timedelta(minutes=10)
_warn_once = OncePer(60.0)


def _placements(info: protocol.GpuInfo, product: Product | None) -> dict[str, Any]:
    """The placements to store: only those inside the product's grid (the protocol already
    bounded their shape; a product with a smaller grid bounds them further)."""
    slices = product.memory_slice_count if product else protocol.MAX_MEMORY_SLICES
    return {
        key: {
            "name": p["name"],
            "placements": [[s, z] for s, z in p["placements"] if z >= 1 and s + z <= slices],
        }
        for key, p in info["possible_placements"].items()
    }


def _first_health(status: str) -> str:
    return {"lost": GpuHealth.LOST, "unavailable": GpuHealth.UNKNOWN}.get(status, GpuHealth.HEALTHY)


def _follow_status(gpu: Gpu, status: str) -> bool:
    """A GPU's NVML status, as a hello or an ack shows it, drives the health workflow (an agent
    that restarted while a GPU was lost sends no ``gpu_lost`` event, only this status)."""
    if status == "lost" and gpu.health != GpuHealth.LOST:
        gpu_mark_unhealthy(
            gpu_id=gpu.pk, cause="lost", reason="NVML reports the GPU lost", health=GpuHealth.LOST
        )
    elif status == "ok" and gpu.health in (GpuHealth.LOST, GpuHealth.UNKNOWN):
        if gpu.health == GpuHealth.UNKNOWN:
            Gpu.objects.filter(pk=gpu.pk, health=GpuHealth.UNKNOWN).update(health=GpuHealth.HEALTHY)
        else:
            gpu_recover(gpu_id=gpu.pk, causes=("lost",), reason="NVML answers for the GPU again")
    else:
        return False
    return True  # the health workflow ran: rows read before may be stale


class WrongHost(ServiceError):
    status_code = 403


@transaction.atomic
def agent_hello(*, host: Host, hello: protocol.Hello) -> bool:
    """Record what the agent discovered. GPUs seen for the first time are adopted as they are
    (their MIG instances become partitions), so enrolling a host never destroys anything.

    A token is bound to the machine that enrolled with it: a hello from another hostname is
    refused (:class:`WrongHost`) and changes nothing.

    Returns whether the agent must be sent the current desired state: it is behind, or what it
    observes differs from what is desired (a reboot or a reset lost its MIG instances).
    """
    host = Host.objects.select_for_update().get(pk=host.pk)
    if host.hostname and hello["hostname"] != host.hostname:
        raise WrongHost(
            "agent.wrong_host",
            f"This token belongs to {host.hostname!r}; {hello['hostname']!r} may not use it.",
            {"host": host.name},
        )
    host.agent_version = hello["agent_version"][:64]
    host.agent_protocol = int(hello["protocol"])
    host.driver_version = (hello["driver_version"] or "")[:64]
    host.nvml_version = (hello["nvml_version"] or "")[:64]
    host.hostname = hello["hostname"][:255]
    host.runtime = hello.get("runtime", AgentRuntime.NONE)
    # Process workloads go only to agents started with --allow-process-runtime.
    host.process_runtime = bool(hello.get("process_runtime", False))
    host.address = hello.get("address", "")[:253]
    host.last_seen_at = timezone.now()
    if host.status == HostStatus.OFFLINE:
        host.status = HostStatus.READY
    applied = min(int(hello["applied_generation"]), host.desired_generation)
    host.applied_generation = (
        max(host.applied_generation, applied) if applied else host.applied_generation
    )
    host.save()
    drift = False
    for gpu, info in zip(gpus_adopt(host=host, gpus=hello["gpus"]), hello["gpus"], strict=True):
        drift = drift or (gpu is not None and _drifted(gpu, info))
    if host.runtime == AgentRuntime.NONE:
        # An agent that runs nothing has nothing left to stop: release what waited for it.
        workloads_record(host_id=host.pk, statuses=[], full=True)
    publish_changed("host", [host.pk])
    # An ack lost with its socket (the agent applied a generation, then the connection dropped
    # before its ack arrived) leaves that generation's operations open, though the agent now
    # says it applied it: send the desired state again, so that the agent's ack settles them,
    # with whatever it failed.
    unsettled = (
        Operation.objects.filter(host=host, generation__lte=host.applied_generation)
        .exclude(status__in=FINAL_STATUSES)
        .exists()
    )
    return drift or unsettled or int(hello["applied_generation"]) < host.desired_generation


def _drifted(gpu: Gpu, info: protocol.GpuInfo) -> bool:
    """Whether the GPU as observed differs from its desired MIG mode or instances."""
    if info["status"] != "ok" or not info["mig_capable"]:
        return False
    if bool(info["mig_mode_current"]) != (gpu.mode == SharingMode.MIG):
        return True
    wanted = {
        (int(p.profile_id or 0), p.start)
        for p in gpu.partitions.all()
        if p.kind == PartitionKind.MIG
    }
    return wanted != {(i["profile_id"], i["start"]) for i in info["mig_instances"]}


def _known_gpus(infos: list[protocol.GpuInfo]) -> dict[str, Gpu]:
    """The reported GPUs already known, with their partitions: two queries for a whole host (a
    fleet of agents reconnecting at once must not cost dozens of queries per host)."""
    return {
        g.uuid: g
        for g in Gpu.objects.filter(uuid__in=[i["uuid"] for i in infos]).prefetch_related(
            "partitions"
        )
    }


def _gpu_observed(
    host: Host, info: protocol.GpuInfo, *, adopt: bool, known: dict[str, Gpu] | None = None
) -> Gpu | None:
    if known is None:
        known = _known_gpus([info])
    gpu = known.get(info["uuid"])
    if gpu is not None and gpu.host_id != host.pk:
        _conflict(host, gpu)
        return None
    product = find_product(name=info["name"]) or find_product(
        pci_device_id=info["pci_device_id"] >> 16
    )
    observed = {
        "mig_mode_current": info["mig_mode_current"],
        "mig_mode_pending": info["mig_mode_pending"],
        "status": info["status"],
        "mig_instances": info["mig_instances"],
        "mps": info["mps"],
    }
    fields = {
        "index": info["index"],
        "product_name": info["name"][:128],
        "pci_device_id": info["pci_device_id"],
        "memory_mib": max(1, info["memory_total_mib"]),
        "mig_capable": info["mig_capable"],
        "product_key": product.key if product else "",
        "reported_placements": _placements(info, product),
        "observed": observed,
    }
    if gpu is None:
        if Gpu.objects.filter(host=host, index=info["index"]).exists():
            Gpu.objects.filter(host=host, index=info["index"]).delete()  # replaced hardware
        gpu = Gpu.objects.create(
            host=host,
            uuid=info["uuid"],
            health=_first_health(info["status"]),
            **fields,
        )
        if adopt:
            _adopt(gpu, info, product)
        return gpu
    changed = [name for name, value in fields.items() if getattr(gpu, name) != value]
    for name in changed:
        setattr(gpu, name, fields[name])
    if changed:  # a reconnect that changes nothing writes nothing
        # Only the observed fields: an operator's cordon or a layout set meanwhile must survive.
        gpu.save(update_fields=[*changed, "updated_at"])
    if _follow_status(gpu, info["status"]):
        gpu.refresh_from_db()
        getattr(gpu, "_prefetched_objects_cache", {}).pop("partitions", None)
    _record_partition_uuids(gpu, info)
    return gpu


def _conflict(host: Host, gpu: Gpu) -> None:
    """The host reported a GPU whose UUID another host holds: ignored, and said where people
    look (both hosts' events), at most once per ``CONFLICT_EVERY`` for the pair. UUIDs are
    unique worldwide, so this is a GPU that moved (an admin forgets it on its old host:
    ``POST /api/v1/gpus/{id}/forget``) or an agent claiming what is not its own."""
    logger.warning(
        "host %s reported GPU %s of host %s: ignored", host.pk, cut(gpu.uuid), gpu.host_id
    )
    since = timezone.now() - CONFLICT_EVERY
    recent = HealthEvent.objects.filter(
        host=host, kind=HealthEventKind.GPU_CONFLICT, detail__contains=gpu.uuid, ts__gte=since
    )
    if recent.exists():
        return
    owner = Host.objects.filter(pk=gpu.host_id).values_list("name", flat=True).first() or "?"
    claimed = (
        f"Reported GPU {gpu.uuid}, which host {owner} holds: ignored. If the GPU moved here, an "
        f"admin forgets it on {owner} (POST /api/v1/gpus/{gpu.pk}/forget)."
    )
    held = f"Host {host.name} reported this GPU ({gpu.uuid}) as its own: ignored."
    now = timezone.now()
    HealthEvent.objects.bulk_create(
        [
            HealthEvent(host=host, kind=HealthEventKind.GPU_CONFLICT, detail=claimed[:500], ts=now),
            # Not tied to the GPU row: the record stays if an admin forgets the GPU.
            HealthEvent(
                host_id=gpu.host_id, kind=HealthEventKind.GPU_CONFLICT, detail=held[:500], ts=now
            ),
        ]
    )


def _adoptable(info: protocol.GpuInfo, product: Product | None) -> list[protocol.MigInstanceInfo]:
    """The reported MIG instances, if together they are a layout the GPU allows (each at a
    placement the agent itself reports for its profile, and valid for the product's rules);
    otherwise none: a layout Fleet would have refused is never adopted as desired state."""
    instances = info["mig_instances"]
    offered = info["possible_placements"]
    for i in instances:
        entry = offered.get(str(i["profile_id"]))
        if entry is None or [i["start"], i["size"]] not in entry["placements"]:
            logger.warning("GPU %s: instance %s is not at an allowed placement", *_ids(info, i))
            return []
    if product is not None:
        reported = {
            int(key): tuple(Placement(s, z) for s, z in p["placements"])
            for key, p in offered.items()
        }
        layout = [Instance(profile_id=i["profile_id"], start=i["start"]) for i in instances]
        violations = validate_layout(product.with_placements(reported), layout)
        if violations:
            logger.warning(
                "GPU %s: reported layout not adopted: %s", cut(info["uuid"]), cut(violations)
            )
            return []
    return instances


def _ids(info: protocol.GpuInfo, instance: protocol.MigInstanceInfo) -> tuple[str, str]:
    return cut(info["uuid"]), cut(f"{instance['profile_id']}@{instance['start']}")


def _adopt(gpu: Gpu, info: protocol.GpuInfo, product: Product | None) -> None:
    """Make the desired state of a newly seen GPU what it already is."""
    if info["mig_mode_current"] and gpu.mig_capable:
        gpu.mode = SharingMode.MIG
        gpu.mig_enabled = True
        for instance in _adoptable(info, product):
            placement = info["possible_placements"].get(str(instance["profile_id"]))
            Partition.objects.get_or_create(
                gpu=gpu,
                kind=PartitionKind.MIG,
                start=instance["start"],
                defaults={
                    "profile_id": instance["profile_id"],
                    "size": instance["size"],
                    "profile_name": placement["name"] if placement else str(instance["profile_id"]),
                    "compute_slices": placement["compute_slices"] if placement else 1,
                    "memory_mib": instance["memory_mib"]
                    or (placement["memory_mib"] if placement else 1),
                    "uuid": instance["uuid"] or "",
                },
            )
    else:
        mps_running = bool(info["mps"].get("running"))
        gpu.mode = SharingMode.MPS if mps_running else SharingMode.DEDICATED
        Partition.objects.create(
            gpu=gpu, kind=PartitionKind.GPU, memory_mib=gpu.memory_mib, mps_enabled=mps_running
        )
    gpu.save(update_fields=["mode", "mig_enabled"])


def _record_partition_uuids(gpu: Gpu, info: protocol.GpuInfo) -> None:
    by_place = {(i["profile_id"], i["start"]): i["uuid"] or "" for i in info["mig_instances"]}
    for partition in gpu.partitions.all():  # prefetched: filtered here, not by a query
        if partition.kind != PartitionKind.MIG:
            continue
        uuid = by_place.get((int(partition.profile_id or 0), partition.start), "")
        if partition.uuid != uuid:
            Partition.objects.filter(pk=partition.pk).update(uuid=uuid)
            partition.uuid = uuid


def gpus_adopt(*, host: Host, gpus: list[protocol.GpuInfo]) -> list[Gpu | None]:
    """Record GPUs as discovered on ``host`` (a hello without the rest): new ones are adopted as
    they are, known ones updated; ``None`` for a GPU that belongs to another host (ignored)."""
    known = _known_gpus(gpus)
    found = [_gpu_observed(host, info, adopt=True, known=known) for info in gpus]
    _forget_gpu_map(host.pk)
    return found


def gpus_observed(*, host: Host, gpus: list[protocol.GpuInfo]) -> None:
    """The GPUs as an ack describes them after applying (no adoption: they are known)."""
    known = _known_gpus(gpus)
    for info in gpus:
        _gpu_observed(host, info, adopt=False, known=known)
    _forget_gpu_map(host.pk)


def _forget_gpu_map(host_id: int) -> None:
    """Telemetry maps this host's GPUs and MIG instances afresh once the change is committed."""
    transaction.on_commit(lambda: gpu_maps.forget_host(host_id))
