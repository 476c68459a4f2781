"""What agents report: enrolment, hello (discovery), telemetry and health events.

Every function takes the ``Host`` its token authenticated; a GPU is only ever looked up within
that host, so an agent can never read or write another host's state.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.core.errors import ServiceError
from fleet.core.events import publish_changed
from fleet.core.tokens import hash_token, new_token, token_prefix
from fleet.inventory.models import (
    Gpu,
    GpuHealth,
    HealthEvent,
    Host,
    HostStatus,
    SharingMode,
)
from fleet.inventory.services import HOST_TOKEN_KIND
from fleet.inventory.telemetry import GpuTick, get_store, publish_live, trusted_ts
from fleet.mig import find_product
from fleet.partitioning.models import OperationKind, OperationStatus, Partition, PartitionKind
from fleet.partitioning.services import operation_record
from hostagent import protocol

logger = logging.getLogger(__name__)


class EnrollmentRefused(ServiceError):
    status_code = 401


def host_issue_token(host: Host) -> str:
    """A fresh per-host token (the old one stops working); only its hash is stored."""
    token = new_token(HOST_TOKEN_KIND)
    Host.objects.filter(pk=host.pk).update(
        token_prefix=token_prefix(token), token_hash=hash_token(token)
    )
    return token


@transaction.atomic
def host_enroll(*, enrollment_token: str, hostname: str) -> tuple[Host, str]:
    """Trade a one-time enrollment token for the host's own token."""
    digest = hash_token(enrollment_token)
    host = Host.objects.select_for_update().filter(enrollment_token_hash=digest).first()
    if host is None or not enrollment_token:
        raise EnrollmentRefused(
            "agent.enrollment_refused", "Unknown or already used enrollment token."
        )
    if host.enrollment_expires_at is not None and host.enrollment_expires_at < timezone.now():
        raise EnrollmentRefused("agent.enrollment_expired", "This enrollment token has expired.")
    host.enrollment_token_hash = ""  # one-time: burnt on use
    host.enrollment_expires_at = None
    host.hostname = hostname[:255]
    host.save(
        update_fields=["enrollment_token_hash", "enrollment_expires_at", "hostname", "updated_at"]
    )
    token = host_issue_token(host)
    operation_record(
        kind=OperationKind.ENROLL_HOST,
        summary=f"Agent enrolled for {host.name} ({hostname})",
        host=host,
        status=OperationStatus.SUCCEEDED,
    )
    return host, token


def host_authenticate(token: str) -> Host | None:
    """The host a per-host token belongs to, or ``None``."""
    if not token.startswith(f"{HOST_TOKEN_KIND}_"):
        return None
    return Host.objects.filter(
        token_prefix=token_prefix(token), token_hash=hash_token(token)
    ).first()


def _placements(info: protocol.GpuInfo) -> dict[str, Any]:
    return {
        key: {"name": p["name"], "placements": [list(pl) for pl in p["placements"]]}
        for key, p in info["possible_placements"].items()
    }


def _first_health(status: str) -> str:
    return {"lost": GpuHealth.LOST, "unavailable": GpuHealth.UNKNOWN}.get(status, GpuHealth.HEALTHY)


def _follow_status(gpu: Gpu, status: str) -> None:
    """A GPU's NVML status, as a hello or an ack shows it, drives the health workflow (an agent
    that restarted while a GPU was lost sends no ``gpu_lost`` event, only this status)."""
    from fleet.allocations.health import gpu_mark_unhealthy, gpu_recover

    if status == "lost" and gpu.health != GpuHealth.LOST:
        gpu_mark_unhealthy(
            gpu_id=gpu.pk, cause="lost", reason="NVML reports the GPU lost", health=GpuHealth.LOST
        )
    elif status == "ok" and gpu.health in (GpuHealth.LOST, GpuHealth.UNKNOWN):
        if gpu.health == GpuHealth.UNKNOWN:
            Gpu.objects.filter(pk=gpu.pk, health=GpuHealth.UNKNOWN).update(health=GpuHealth.HEALTHY)
        else:
            gpu_recover(gpu_id=gpu.pk, causes=("lost",), reason="NVML answers for the GPU again")


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
    host.driver_version = (hello["driver_version"] or "")[:64]
    host.nvml_version = (hello["nvml_version"] or "")[:64]
    host.hostname = hello["hostname"][:255]
    host.last_seen_at = timezone.now()
    if host.status == HostStatus.OFFLINE:
        host.status = HostStatus.READY
    applied = min(int(hello["applied_generation"]), host.desired_generation)
    host.applied_generation = (
        max(host.applied_generation, applied) if applied else host.applied_generation
    )
    host.save()
    drift = False
    for info in hello["gpus"]:
        gpu = _gpu_observed(host, info, adopt=True)
        drift = drift or (gpu is not None and _drifted(gpu, info))
    publish_changed("host", [host.pk])
    return drift or int(hello["applied_generation"]) < host.desired_generation


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


def _gpu_observed(host: Host, info: protocol.GpuInfo, *, adopt: bool) -> Gpu | None:
    gpu = Gpu.objects.filter(uuid=info["uuid"]).first()
    if gpu is not None and gpu.host_id != host.pk:
        logger.warning(
            "host %s reported GPU %s of host %s: ignored", host.pk, info["uuid"], gpu.host_id
        )
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
        "reported_placements": _placements(info),
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
            _adopt(gpu, info)
        return gpu
    for name, value in fields.items():
        setattr(gpu, name, value)
    # Only the observed fields: an operator's cordon or a layout set meanwhile must survive.
    gpu.save(update_fields=[*fields, "updated_at"])
    _follow_status(gpu, info["status"])
    _record_partition_uuids(gpu, info)
    return gpu


def _adopt(gpu: Gpu, info: protocol.GpuInfo) -> None:
    """Make the desired state of a newly seen GPU what it already is."""
    if info["mig_mode_current"]:
        gpu.mode = SharingMode.MIG
        gpu.mig_enabled = True
        for instance in info["mig_instances"]:
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
    for partition in gpu.partitions.filter(kind=PartitionKind.MIG):
        uuid = by_place.get((int(partition.profile_id or 0), partition.start), "")
        if partition.uuid != uuid:
            Partition.objects.filter(pk=partition.pk).update(uuid=uuid)


def gpus_observed(*, host: Host, gpus: list[protocol.GpuInfo]) -> None:
    """The GPUs as an ack describes them after applying (no adoption: they are known)."""
    for info in gpus:
        _gpu_observed(host, info, adopt=False)


def agent_telemetry(*, host: Host, telemetry: protocol.Telemetry) -> int:
    """Store one tick: latest values and a 1 s point per GPU in the telemetry store (Redis, or
    memory in the embedded mode; see :mod:`fleet.inventory.telemetry`), and a live frame for
    browsers. No ORM write per tick: ``Host.last_seen_at`` is refreshed at most every
    :func:`_seen_every` seconds, ``Gpu.last_telemetry`` is checkpointed by the rollup task.

    Returns the number of GPU samples stored."""
    received = time.time()
    ts = trusted_ts(float(telemetry["ts"]), received)
    known = _host_gpus(host, [s["uuid"] for s in telemetry["gpus"]])
    ticks, live = [], {}
    ts_ms = int(ts * 1000)
    for sample in telemetry["gpus"]:
        gpu = known.get(sample["uuid"])
        if gpu is None:
            continue
        gpu_id, health, instances = gpu
        power_w = sample["power_mw"] / 1000 if sample["power_mw"] is not None else None
        ticks.append(
            GpuTick(
                gpu_id=gpu_id,
                utilization_percent=sample["utilization_gpu_percent"],
                memory_used_mib=sample["memory_used_mib"],
                temperature_c=sample["temperature_c"],
                power_w=power_w,
                sample=dict(sample),
            )
        )
        # GpuLive, plus the sample's agent time in ms (an int: browsers round floats).
        live[str(gpu_id)] = {
            "utilization_percent": sample["utilization_gpu_percent"],
            "memory_used_mib": sample["memory_used_mib"],
            "memory_total_mib": sample["memory_total_mib"],
            "temperature_c": sample["temperature_c"],
            "power_w": power_w,
            "health": health,
            "partitions": {
                str(instances[m["gpu_instance_id"]]): {
                    "utilization_percent": m["utilization_percent"],
                    "memory_used_mib": m["memory_used_mib"],
                }
                for m in sample["mig"]
                if m["gpu_instance_id"] in instances
            },
            "ts_ms": ts_ms,
        }
    get_store().record(host_id=host.pk, ts=ts, received_at=received, ticks=ticks)
    seen = host.last_seen_at
    if seen is None or received - seen.timestamp() >= _seen_every():
        host.last_seen_at = timezone.now()  # the caller may keep this row between ticks
        Host.objects.filter(pk=host.pk).update(last_seen_at=host.last_seen_at)
    publish_live(host.pk, float(telemetry["ts"]), live)
    return len(ticks)


def _seen_every() -> float:
    """How stale ``Host.last_seen_at`` may get: a quarter of the offline limit, at most 5 s."""
    limit = float(settings.FLEET_HEARTBEAT_SECONDS) * int(settings.FLEET_OFFLINE_AFTER_MISSED)
    return max(0.0, min(5.0, limit / 4))


# (host id, host created_at) -> (fetched at, {uuid: (gpu id, health, {GPU instance id: partition}})
_GpuMap = dict[str, tuple[int, str, dict[int, int]]]
_gpu_maps: dict[tuple[int, float], tuple[float, _GpuMap]] = {}


def _host_gpus(host: Host, uuids: list[str]) -> _GpuMap:
    """The host's GPUs by UUID, cached for ``FLEET_TELEMETRY_GPU_CACHE_SECONDS`` (default 2 s):
    a tick then costs no query. A UUID the cache does not know refetches at once; health and MIG
    instances in live frames may lag by the cache time (``live.changed`` re-renders anyway)."""
    key = (host.pk, host.created_at.timestamp() if host.created_at else 0.0)
    ttl = float(getattr(settings, "FLEET_TELEMETRY_GPU_CACHE_SECONDS", 2.0))
    now = time.monotonic()
    cached = _gpu_maps.get(key)
    if cached is not None and now - cached[0] < ttl and all(u in cached[1] for u in uuids):
        return cached[1]
    gpus = list(
        Gpu.objects.filter(host=host).only("pk", "uuid", "health", "observed").order_by("pk")
    )
    partitions = _partitions_by_instance(gpus)
    found: _GpuMap = {
        g.uuid: (
            g.pk,
            str(g.health),
            {gi: pid for (gid, gi), pid in partitions.items() if gid == g.pk},
        )
        for g in gpus
    }
    if len(_gpu_maps) > 100_000:
        _gpu_maps.clear()
    _gpu_maps[key] = (now, found)
    return found


def _partitions_by_instance(gpus: Any) -> dict[tuple[int, int], int]:
    """(gpu id, NVML GPU-instance id) -> partition id, from the instances the agent observed.

    One query for all the GPUs' MIG partitions (not one per GPU)."""
    gpus = list(gpus)
    by_place: dict[int, dict[tuple[int | None, int], int]] = {}
    for gpu_id, profile_id, start, pk in Partition.objects.filter(
        gpu_id__in=[g.pk for g in gpus], kind=PartitionKind.MIG
    ).values_list("gpu_id", "profile_id", "start", "pk"):
        by_place.setdefault(gpu_id, {})[(profile_id, start)] = pk
    found: dict[tuple[int, int], int] = {}
    for gpu in gpus:
        places = by_place.get(gpu.pk, {})
        observed = gpu.observed if isinstance(gpu.observed, dict) else {}
        for instance in observed.get("mig_instances", []) or []:
            partition = places.get((instance.get("profile_id"), instance.get("start")))
            if partition is not None:
                found[(gpu.pk, int(instance["gpu_instance_id"]))] = partition
    return found


def agent_event(*, host: Host, event: protocol.Event) -> HealthEvent | None:
    """Record a health event from the agent. Health decisions act on it (see ``fleet.health``)."""
    gpu = (
        Gpu.objects.filter(host=host, uuid=event["gpu_uuid"]).first() if event["gpu_uuid"] else None
    )
    if event["gpu_uuid"] and gpu is None:
        logger.warning("host %s sent an event for unknown GPU %s", host.pk, event["gpu_uuid"])
        return None
    row = HealthEvent.objects.create(
        host=host,
        gpu=gpu,
        kind=event["kind"],
        xid=event["xid"],
        gpu_instance_id=event["gpu_instance_id"],
        detail=event["detail"][:500],
        ts=datetime.fromtimestamp(float(event["ts"]), tz=UTC),
    )
    from fleet.allocations.health import on_event  # health acts on what agents report

    on_event(row)
    publish_changed("event", [row.pk])
    if gpu is not None:
        publish_changed("gpu", [gpu.pk])
    return row


def host_touch(host_id: int) -> None:
    Host.objects.filter(pk=host_id).update(last_seen_at=timezone.now())
