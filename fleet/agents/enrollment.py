"""Enrolment and host tokens: an agent trades its one-time enrollment token for the host's own
token (stored as a hash); that token authenticates every message after, and issuing a new one
closes the sockets opened with the old."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from fleet.core.errors import ServiceError
from fleet.core.models import OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.core.tokens import hash_token, new_token, token_lookup_prefixes, token_prefix
from fleet.inventory.models import Host
from fleet.inventory.services import HOST_TOKEN_KIND, host_close_agent_sockets


class EnrollmentRefused(ServiceError):
    status_code = 401


def host_issue_token(host: Host) -> str:
    """A fresh per-host token; only its hash is stored. The old one stops working, and sockets
    opened with it are closed (:func:`host_revoke_token`)."""
    token = new_token(HOST_TOKEN_KIND)
    Host.objects.filter(pk=host.pk).update(
        token_prefix=token_prefix(token), token_hash=hash_token(token)
    )
    host_close_agent_sockets(host.pk)
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
    # Hosts enrolled before prefixes were fixed may hold the legacy (often empty) prefix.
    return Host.objects.filter(
        token_prefix__in=token_lookup_prefixes(token), token_hash=hash_token(token)
    ).first()


def host_token_current(host_id: int, token_hash: str) -> bool:
    """Whether ``token_hash`` is still the host's token (not revoked, not rotated)."""
    return bool(token_hash) and Host.objects.filter(pk=host_id, token_hash=token_hash).exists()
