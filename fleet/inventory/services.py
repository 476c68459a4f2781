"""Writes on the inventory: hosts and the GPUs their agents report."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from fleet.core.errors import Conflict
from fleet.core.tokens import hash_token, new_token
from fleet.inventory.models import Gpu, Host, HostStatus
from fleet.partitioning.models import OperationKind, OperationStatus
from fleet.partitioning.services import operation_record

HOST_TOKEN_KIND = "flh"
ENROLLMENT_TOKEN_KIND = "fle"
ENROLLMENT_TTL = timedelta(days=7)


@transaction.atomic
def host_create(
    *, name: str, labels: dict[str, str] | None = None, requested_by: Any = None
) -> tuple[Host, str]:
    """A new host waiting for its agent; returns the one-time enrollment token (never stored)."""
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
