"""Enrolment and host tokens: an agent trades its one-time enrollment token for the host's own
token (stored as a hash); that token authenticates every message after, and issuing a new one
closes the sockets opened with the old.

Host tokens expire (``FLEET_HOST_TOKEN_DAYS``) and are renewed before that
(:mod:`fleet.agents.host_tokens`). A token a renewal replaced (``previous_token_hash``) is still
accepted until ``previous_token_expires_at`` or until the agent has used the new one, so that a
renewal lost on the way locks no host out. It shares the new token's public prefix, so both are
found by one indexed lookup. An expired token is refused like an unknown one (the agent learns
nothing from the difference); the log says it expired.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleet.agents.host_tokens import token_lifetime
from fleet.core.errors import ServiceError
from fleet.core.models import OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.core.tokens import hash_token, new_token, token_lookup_prefixes, token_prefix
from fleet.inventory.models import Host
from fleet.inventory.services import HOST_TOKEN_KIND, host_close_agent_sockets

logger = logging.getLogger(__name__)

# A host whose agent keeps trying an expired token is logged at most this often per process.
EXPIRED_LOG_EVERY_S = 300.0


class EnrollmentRefused(ServiceError):
    status_code = 401


def host_issue_token(host: Host) -> str:
    """A fresh per-host token, valid ``FLEET_HOST_TOKEN_DAYS``; only its hash is stored. The old
    one (and any previous one) stops working, and sockets opened with it are closed
    (:func:`host_revoke_token`)."""
    token = new_token(HOST_TOKEN_KIND)
    Host.objects.filter(pk=host.pk).update(
        token_prefix=token_prefix(token),
        token_hash=hash_token(token),
        token_expires_at=timezone.now() + token_lifetime(),
        previous_token_hash="",
        previous_token_expires_at=None,
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


@dataclass(frozen=True)
class TokenHolder:
    """Who a host token belongs to, as an agent socket needs it (no row held)."""

    host_id: int
    created: float  # the host row's creation time: a host deleted and re-created is another
    token_hash: str  # the hash of the token presented
    # When the presented token stops working (Unix seconds); None: a token issued before
    # tokens expired, accepted until its first renewal.
    expires_at: float | None = None
    # The token a renewal replaced: accepted until ``expires_at``, and renewed at once.
    previous: bool = False
    # The current token while the one it replaced is still accepted: its first use retires
    # that one (:func:`host_token_previous_forget`).
    replaced: bool = False

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now


def _epoch(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


class TokenColumns(NamedTuple):
    """One host's token columns, as :func:`hosts_authenticate` reads them."""

    pk: int
    created_at: datetime | None
    token_hash: str
    token_expires_at: datetime | None
    previous_token_hash: str
    previous_token_expires_at: datetime | None

    @classmethod
    def of(cls, host: Host) -> TokenColumns:
        return cls(*(getattr(host, name) for name in cls._fields))

    def holder(self, digest: str) -> TokenHolder | None:
        """The holder of the token hashed ``digest``, or ``None`` if it is neither token."""
        born = self.created_at.timestamp() if self.created_at else 0.0
        if digest and digest == self.token_hash:
            replaced = bool(self.previous_token_hash)
            return TokenHolder(
                self.pk, born, digest, _epoch(self.token_expires_at), replaced=replaced
            )
        if digest and digest == self.previous_token_hash:
            # A previous token without an expiry was never given a grace: it is not accepted.
            until = _epoch(self.previous_token_expires_at) or 0.0
            return TokenHolder(self.pk, born, digest, until, previous=True)
        return None


def hosts_authenticate(tokens: list[str]) -> dict[str, TokenHolder]:
    """Many agents' tokens checked in one query: ``{token: holder}`` for those that are a host's
    current or previous token (the others are absent). The sockets of a whole fleet
    reconnecting at once are admitted a batch at a time this way (:mod:`fleet.live.admission`).

    Expired tokens are returned too (:meth:`TokenHolder.expired`): the caller refuses them, and
    a cache keeps the expiry with the entry. Nothing is written."""
    wanted = {hash_token(t): t for t in tokens if t.startswith(f"{HOST_TOKEN_KIND}_")}
    if not wanted:
        return {}
    prefixes = sorted({p for t in wanted.values() for p in token_lookup_prefixes(t)})
    digests = list(wanted)
    rows = Host.objects.filter(
        Q(token_hash__in=digests) | Q(previous_token_hash__in=digests),
        token_prefix__in=prefixes,
    ).values_list(*TokenColumns._fields)
    found: dict[str, TokenHolder] = {}
    for row in rows:
        columns = TokenColumns(*row)
        for digest in {columns.token_hash, columns.previous_token_hash} & wanted.keys():
            holder = columns.holder(digest)
            if holder is not None:
                found[wanted[digest]] = holder
    return found


_expired_logged: dict[int, float] = {}


def holder_admitted(holder: TokenHolder | None, now: float | None = None) -> TokenHolder | None:
    """``holder`` if its token is still valid at ``now``; ``None`` when there is none or its
    token expired. An expired token is refused as an unknown one is, and the log says so
    (once per :data:`EXPIRED_LOG_EVERY_S` per host; no token material)."""
    now = time.time() if now is None else now
    if holder is None or not holder.expired(now):
        return holder
    if now - _expired_logged.get(holder.host_id, -EXPIRED_LOG_EVERY_S) >= EXPIRED_LOG_EVERY_S:
        _expired_logged[holder.host_id] = now
        logger.warning(
            "host %s: refused its %s agent token: expired at %s (give the agent a new one: "
            "POST /api/v1/hosts/%s/rotate-token, or enrol it again)",
            holder.host_id,
            "previous" if holder.previous else "current",
            datetime.fromtimestamp(holder.expires_at or 0.0).astimezone().isoformat(),
            holder.host_id,
        )
    return None


def host_authenticate(token: str) -> Host | None:
    """The host a per-host token belongs to, or ``None`` (unknown, revoked or expired). Using
    the current token retires the one a renewal replaced (one compare-and-set write, once)."""
    if not token.startswith(f"{HOST_TOKEN_KIND}_"):
        return None
    digest = hash_token(token)
    # Hosts enrolled before prefixes were fixed may hold the legacy (often empty) prefix.
    host = Host.objects.filter(
        Q(token_hash=digest) | Q(previous_token_hash=digest),
        token_prefix__in=token_lookup_prefixes(token),
    ).first()
    if host is None:
        return None
    holder = holder_admitted(TokenColumns.of(host).holder(digest))
    if holder is None:
        return None
    if holder.replaced and host_token_previous_forget(host.pk, digest):
        host.previous_token_hash, host.previous_token_expires_at = "", None
    return host


def host_token_previous_forget(host_id: int, token_hash: str) -> bool:
    """The agent used its current token ``token_hash``: the one a renewal replaced is no
    longer accepted (compare-and-set: a no-op once done, or if the token changed meanwhile)."""
    return bool(
        Host.objects.filter(pk=host_id, token_hash=token_hash)
        .exclude(previous_token_hash="")
        .update(previous_token_hash="", previous_token_expires_at=None)
    )


def host_token_current(host_id: int, token_hash: str) -> bool:
    """Whether ``token_hash`` is still the host's token (not revoked, not rotated)."""
    return bool(token_hash) and Host.objects.filter(pk=host_id, token_hash=token_hash).exists()
