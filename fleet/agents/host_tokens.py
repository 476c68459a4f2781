"""Host token expiry, renewal and rotation (security review: "host tokens never expire").

A host token is valid ``FLEET_HOST_TOKEN_DAYS`` (90) from its issue. An agent that connects, or
reports over REST, with less than ``FLEET_HOST_TOKEN_RENEW_DAYS`` (30) left, with a token from
before expiry existed (``token_expires_at`` null), or with the token a renewal replaced, is
sent a new one (a ``host_token`` message: down its socket, or in the REST report's answer).

A renewal is made so that a message lost on the way locks no host out: the token the agent
presented becomes the host's *previous* token, still accepted for :data:`RENEW_GRACE` (never
past its own expiry) or until the agent has used the new one once. An agent that comes back
with that previous token (the renewal never reached it) is renewed again, and its previous
token is left as it was.

An admin can rotate a token (``POST /hosts/{id}/rotate-token``): the new one is pushed to the
host's socket if it has one, returned once, and the old one is accepted for
:data:`ROTATE_GRACE`, or refused at once with ``revoke`` (a token thought compromised: its
sockets are closed, and the agent needs the returned token installed by hand).

Every renewal and rotation is an operation of kind ``rotate_host_token``; no token is in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.core.errors import NotFound
from fleet.core.events import agent_group, publish
from fleet.core.models import OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.core.tokens import hash_token, new_token, token_prefix
from fleet.inventory.models import Host
from fleet.inventory.services import HOST_TOKEN_KIND, host_close_agent_sockets
from hostagent import protocol

RENEW_GRACE = timedelta(days=1)
"""How long the token a renewal replaced is still accepted (if the agent never uses the new)."""
ROTATE_GRACE = timedelta(hours=1)
"""How long the token an admin rotation replaced is still accepted (unless revoked)."""


def token_lifetime() -> timedelta:
    return timedelta(days=float(settings.FLEET_HOST_TOKEN_DAYS))


def renew_window() -> timedelta:
    return timedelta(days=float(settings.FLEET_HOST_TOKEN_RENEW_DAYS))


def renewal_due(expires_at: float | None, *, previous: bool, now: float) -> bool:
    """Whether an agent presenting a token that expires at ``expires_at`` (Unix seconds; None:
    issued before tokens expired) gets a new one. ``previous``: it is the token a renewal
    replaced, so the agent never received the current one, which only a new token can fix."""
    if previous or expires_at is None:
        return True
    return expires_at - now < renew_window().total_seconds()


def host_renewal_due(host: Host, token: str, now: datetime | None = None) -> bool:
    """:func:`renewal_due` for ``token`` against the host row already read (no query)."""
    now = now or timezone.now()
    digest = hash_token(token)
    previous = digest == host.previous_token_hash and digest != host.token_hash
    expires = host.token_expires_at.timestamp() if host.token_expires_at else None
    return renewal_due(expires, previous=previous, now=now.timestamp())


def host_token_message(token: str, expires_at: datetime) -> protocol.HostToken:
    return {"type": "host_token", "token": token, "expires_at": expires_at.timestamp()}


@dataclass(frozen=True)
class _Swap:
    """What a renewal or rotation writes: the new token and the previous one kept."""

    token: str
    expires_at: datetime
    previous_hash: str
    previous_until: datetime | None


def _write(host: Host, swap: _Swap) -> None:
    Host.objects.filter(pk=host.pk).update(
        token_prefix=token_prefix(swap.token),
        token_hash=hash_token(swap.token),
        token_expires_at=swap.expires_at,
        previous_token_hash=swap.previous_hash,
        previous_token_expires_at=swap.previous_until,
    )


def _record(host: Host, swap: _Swap, *, reason: str, summary: str, requested_by: Any) -> None:
    """The audit: when the new token expires and until when the old one holds; no token."""
    operation_record(
        kind=OperationKind.ROTATE_HOST_TOKEN,
        summary=summary,
        requested_by=requested_by,
        host=host,
        status=OperationStatus.SUCCEEDED,
        payload={
            "reason": reason,
            "expires_at": swap.expires_at.isoformat(),
            "previous_expires_at": swap.previous_until.isoformat() if swap.previous_until else None,
        },
    )


def host_token_renew(*, host_id: int, token: str) -> protocol.HostToken | None:
    """Renew the token ``token`` of the host if it is due (:func:`renewal_due`); the
    ``host_token`` message to send the agent, or ``None`` (not due, or the token is no longer
    the host's: revoked or rotated meanwhile, or another socket renewed it first).

    Compare-and-set under the host's row lock: two sockets of one host renewing at once renew
    once each in turn, never from a token already gone."""
    digest = hash_token(token)
    with transaction.atomic():
        host = Host.objects.select_for_update().filter(pk=host_id).first()
        if host is None:
            return None
        now = timezone.now()
        if digest == host.token_hash:
            if not host_renewal_due(host, token, now):
                return None
            # Never longer than it had: a renewal must not extend a token about to expire.
            until = now + RENEW_GRACE
            if host.token_expires_at is not None:
                until = min(until, host.token_expires_at)
            previous_hash = digest
        elif (
            digest == host.previous_token_hash
            and host.previous_token_expires_at is not None
            and host.previous_token_expires_at > now
        ):
            # The agent never got the current token (the renewal was lost): a new one replaces
            # it, and the agent's own stays its fallback for as long as it had.
            previous_hash, until = digest, host.previous_token_expires_at
        else:
            return None
        swap = _Swap(
            token=new_token(HOST_TOKEN_KIND, prefix=token_prefix(token)),
            expires_at=now + token_lifetime(),
            previous_hash=previous_hash,
            previous_until=until,
        )
        _write(host, swap)
        _record(
            host,
            swap,
            reason="renewal",
            summary=f"Agent token of {host.name} renewed (valid until {swap.expires_at:%Y-%m-%d})",
            requested_by=None,
        )
    return host_token_message(swap.token, swap.expires_at)


def host_token_rotate(
    *, host_id: int, revoke: bool = False, requested_by: Any = None
) -> tuple[Host, str]:
    """A new token for the host (an admin's rotation); returns it, shown once.

    Without ``revoke`` the old token is accepted for :data:`ROTATE_GRACE` more (never past its
    own expiry), and the new one is pushed to the host's socket if it has one: the agent stores
    it and carries on. With ``revoke`` the old token is refused at once, the host's sockets are
    closed, and nothing is pushed (whoever holds the old token may be the one listening).

    Raises:
        NotFound: ``host.not_found``.
    """
    with transaction.atomic():
        host = Host.objects.select_for_update().filter(pk=host_id).first()
        if host is None:
            raise NotFound("host.not_found", f"Host {host_id} does not exist.", {"host": host_id})
        now = timezone.now()
        keep_old = not revoke and bool(host.token_hash)
        until = None
        if keep_old:
            until = now + ROTATE_GRACE
            if host.token_expires_at is not None:
                until = min(until, host.token_expires_at)
        # The old token keeps the prefix index only if the new one shares its prefix. Hosts
        # still holding a legacy empty prefix lose that (they renew to a proper one at their
        # first connection since tokens expire).
        swap = _Swap(
            token=new_token(HOST_TOKEN_KIND, prefix=host.token_prefix if keep_old else ""),
            expires_at=now + token_lifetime(),
            previous_hash=host.token_hash if keep_old else "",
            previous_until=until,
        )
        _write(host, swap)
        done = "revoked and replaced" if revoke else "rotated"
        _record(
            host,
            swap,
            reason="revoke" if revoke else "rotation",
            summary=f"Agent token of {host.name} {done}",
            requested_by=requested_by,
        )
        if revoke:
            host_close_agent_sockets(host.pk)
        else:
            message = host_token_message(swap.token, swap.expires_at)
            transaction.on_commit(
                lambda: publish(agent_group(host_id), "agent.host_token", {"message": message})
            )
    host.refresh_from_db()
    return host, swap.token
