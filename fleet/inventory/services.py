"""Writes on the inventory: hosts and the GPUs their agents report."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import ProtectedError
from django.utils import timezone

from fleet.core.errors import Conflict, NotFound
from fleet.core.events import agent_group, publish, publish_changed
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.core.tokens import hash_token, new_token
from fleet.inventory.labels import labels_checked
from fleet.inventory.models import Gpu, HealthEvent, Host, HostStatus
from fleet.inventory.selectors import latest_telemetry

HOST_TOKEN_KIND = "flh"
ENROLLMENT_TOKEN_KIND = "fle"
ENROLLMENT_TTL = timedelta(days=7)
# A GPU with a sample this recent is still reported by its host (gpu_forget refuses it).
STILL_REPORTED_S = 30.0


@transaction.atomic
def host_create(
    *, name: str, labels: dict[str, str] | None = None, requested_by: Any = None
) -> tuple[Host, str]:
    """A new host waiting for its agent; returns the one-time enrollment token (never stored)."""
    labels = labels_checked(labels or {})
    if Host.objects.filter(name=name).exists():
        raise Conflict("host.name_taken", f"A host named {name!r} already exists.", {"name": name})
    host = Host.objects.create(name=name, labels=labels or {}, status=HostStatus.OFFLINE)
    token = host_issue_enrollment(host)
    operation_record(
        kind=OperationKind.CREATE_HOST,
        summary=f"Created host {name}",
        requested_by=requested_by,
        host=host,
        status=OperationStatus.SUCCEEDED,
    )
    return host, token


def host_issue_enrollment(host: Host) -> str:
    """A new one-time enrollment token for the host (a reinstalled machine enrols again); the
    previous one stops working. Only its hash is kept."""
    token = new_token(ENROLLMENT_TOKEN_KIND)
    Host.objects.filter(pk=host.pk).update(
        enrollment_token_hash=hash_token(token),
        enrollment_expires_at=timezone.now() + ENROLLMENT_TTL,
    )
    return token


def gpu_upsert(
    *,
    host: Host,
    index: int,
    uuid: str,
    product_name: str,
    memory_mib: int,
    pci_device_id: int = 0,
    product_key: str = "",
    mig_capable: bool = False,
    mig_enabled: bool = False,
    reported_placements: dict[str, Any] | None = None,
) -> Gpu:
    """Record a GPU as an agent (or the demo seeder) reports it; the sharing mode is kept."""
    gpu, _ = Gpu.objects.update_or_create(
        uuid=uuid,
        defaults={
            "host": host,
            "index": index,
            "product_name": product_name,
            "memory_mib": memory_mib,
            "pci_device_id": pci_device_id,
            "product_key": product_key,
            "mig_capable": mig_capable,
            "mig_enabled": mig_enabled,
            "reported_placements": reported_placements or {},
        },
    )
    return gpu


def health_events_prune(now: Any = None) -> int:
    """Delete health events past ``FLEET_HEALTH_EVENTS_KEEP_DAYS``; returns how many went."""
    now = now or timezone.now()
    keep = timedelta(days=int(settings.FLEET_HEALTH_EVENTS_KEEP_DAYS))
    deleted, _ = HealthEvent.objects.filter(ts__lt=now - keep).delete()
    return deleted


@transaction.atomic
def host_set_labels(*, host_id: int, labels: Any, requested_by: Any = None) -> Host:
    """Replace the host's labels (bounded: :mod:`fleet.inventory.labels`). Replicas already
    placed stay; placements from now on see the new labels (rule ``placement.host_labels``)."""
    checked = labels_checked(labels)
    host = Host.objects.select_for_update().filter(pk=host_id).first()
    if host is None:
        raise NotFound("host.not_found", f"Host {host_id} does not exist.", {"host": host_id})
    before = dict(host.labels or {})
    if before == checked:
        return host
    host.labels = checked
    host.save(update_fields=["labels", "updated_at"])
    shown = ", ".join(f"{k}={v}" for k, v in sorted(checked.items())) or "none"
    operation_record(
        kind=OperationKind.SET_LABELS,
        summary=f"Labels of {host.name}: {shown}",
        requested_by=requested_by,
        host=host,
        status=OperationStatus.SUCCEEDED,
        payload={"before": before, "after": checked},
    )
    publish_changed("host", [host.pk])
    return host


def host_revoke_token(*, host_id: int, requested_by: Any = None) -> Host:
    """The host's agent token stops working at once: new requests are refused, its open sockets
    are closed within a second, and the host needs a new enrollment token to come back."""
    host = Host.objects.filter(pk=host_id).first()
    if host is None:
        raise NotFound("host.not_found", f"Host {host_id} does not exist.", {"host": host_id})
    with transaction.atomic():
        # The token a renewal replaced goes too: it would otherwise still let the agent in.
        Host.objects.filter(pk=host_id).update(
            token_prefix="",
            token_hash="",
            token_expires_at=None,
            previous_token_hash="",
            previous_token_expires_at=None,
        )
        operation_record(
            kind=OperationKind.ENROLL_HOST,
            summary=f"Agent token of {host.name} revoked",
            host=host,
            status=OperationStatus.SUCCEEDED,
            requested_by=requested_by,
        )
        host_close_agent_sockets(host_id)
    host.refresh_from_db()
    return host


def gpu_forget(*, gpu_id: int, requested_by: Any = None) -> Operation:
    """Forget a GPU the inventory holds for a host (admin): the next hello of the host that
    has it adopts it. For a GPU moved to another host, whose reports are ignored while its UUID
    belongs to the old one (the conflict is in both hosts' events).

    Raises:
        NotFound: ``gpu.not_found``.
        Conflict: ``gpu.in_use``: replicas are placed on it (move or delete them first); its
            host still reports it (``gpu.still_reported``: revoke that host's token first, or
            it takes the GPU back with its next hello).
    """
    with transaction.atomic():
        gpu = Gpu.objects.select_for_update().select_related("host").filter(pk=gpu_id).first()
        if gpu is None:
            raise NotFound("gpu.not_found", f"GPU {gpu_id} does not exist.", {"gpu": gpu_id})
        subject = {"gpu": gpu.pk, "uuid": gpu.uuid, "host": gpu.host.name}
        heard = latest_telemetry([gpu.pk]).get(gpu.pk)
        if (
            gpu.host.status != HostStatus.OFFLINE
            and heard is not None
            and time.time() - heard["received_at"] < STILL_REPORTED_S
        ):
            raise Conflict(
                "gpu.still_reported",
                f"Host {gpu.host.name} still reports GPU {gpu.uuid}: it would take it back. "
                "Revoke its agent token (or wait until it stops reporting it) first.",
                subject,
            )
        try:
            with transaction.atomic():
                gpu.delete()
        except ProtectedError:
            raise Conflict(
                "gpu.in_use",
                f"GPU {gpu.uuid} of {gpu.host.name} holds replicas: move or delete them first.",
                subject,
            ) from None
        operation = operation_record(
            kind=OperationKind.FORGET_GPU,
            summary=f"Forgot GPU {gpu.uuid} of {gpu.host.name}: the host that has it adopts it",
            requested_by=requested_by,
            host=gpu.host,
            status=OperationStatus.SUCCEEDED,
            payload=subject,
        )
    publish_changed("host", [gpu.host_id])
    return operation


def host_close_agent_sockets(host_id: int) -> None:
    """After commit, every socket of the host re-checks its token (and closes if it is gone)."""
    transaction.on_commit(lambda: publish(agent_group(host_id), "agent.revoke", {}))
