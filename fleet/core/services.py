"""Writes for users, roles, API tokens and the record of failed logins."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from fleet.core import login_throttle
from fleet.core.authentication import USER_TOKEN_KIND
from fleet.core.errors import Conflict, ServiceError
from fleet.core.models import ApiToken, LoginFailure, OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.core.roles import GROUP_NAMES, Role
from fleet.core.tokens import hash_token, new_token, token_prefix

logger = logging.getLogger(__name__)

MAX_TOKEN_DAYS = 3650


def roles_ensure() -> None:
    for name in GROUP_NAMES.values():
        Group.objects.get_or_create(name=name)


@transaction.atomic
def user_create(*, username: str, password: str | None, role: Role, email: str = "") -> Any:
    """Create (or update) a user holding exactly ``role``."""
    roles_ensure()
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=username, defaults={"email": email})
    if password is not None:
        user.set_password(password)
    # Admins run the Django admin too (hosts, enrollment tokens, users): full rights there.
    user.is_staff = user.is_superuser = role >= Role.ADMIN
    user.save()
    user.groups.set(Group.objects.filter(name=GROUP_NAMES[role]))
    operation_record(
        kind=OperationKind.CHANGE_USER,
        summary=f"User {username} {'created' if created else 'updated'} as {role.label}",
        status=OperationStatus.SUCCEEDED,
        payload={"user": user.pk, "role": role.label, "password_set": password is not None},
    )
    return user


def max_tokens_per_user() -> int:
    return settings.FLEET_MAX_API_TOKENS_PER_USER


@transaction.atomic
def api_token_create(
    *, user: Any, name: str, expires_in_days: int | None = None
) -> tuple[ApiToken, str]:
    """A new API token for ``user``; the returned secret is never stored and never shown again.

    Refused (409 ``token.limit``) when the user already holds ``FLEET_MAX_API_TOKENS_PER_USER``
    tokens, expired ones included: a leaked token must not be able to mint tokens without end.
    """
    if expires_in_days is not None and not 1 <= expires_in_days <= MAX_TOKEN_DAYS:
        raise ServiceError(
            "token.invalid_expiry",
            f"expires_in_days must be between 1 and {MAX_TOKEN_DAYS}.",
            {"expires_in_days": expires_in_days},
        )
    # The user's row is the lock: two concurrent requests cannot both pass the cap.
    get_user_model().objects.select_for_update().only("pk").get(pk=user.pk)
    held, limit = ApiToken.objects.filter(user_id=user.pk).count(), max_tokens_per_user()
    if held >= limit:
        raise Conflict(
            "token.limit",
            f"You hold {held} API tokens, the most allowed; revoke one before creating another.",
            {"limit": limit, "held": held},
        )
    secret = new_token(USER_TOKEN_KIND)
    expires_at = timezone.now() + timedelta(days=expires_in_days) if expires_in_days else None
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=token_prefix(secret),
        key_hash=hash_token(secret),
        expires_at=expires_at,
    )
    operation_record(
        kind=OperationKind.CREATE_TOKEN,
        summary=f"API token {token} created for {user.get_username()}",
        requested_by=user,
        status=OperationStatus.SUCCEEDED,
        payload={"token": token.pk, "user": user.pk, "expires_at": _iso(expires_at)},
    )
    return token, secret


@transaction.atomic
def api_token_revoke(*, token: ApiToken, requested_by: Any) -> None:
    """Delete the token (its next request is refused), recorded in the audit trail."""
    operation_record(
        kind=OperationKind.REVOKE_TOKEN,
        summary=f"API token {token} of {token.user.get_username()} revoked",
        requested_by=requested_by,
        status=OperationStatus.SUCCEEDED,
        payload={"token": token.pk, "user": token.user_id},
    )
    token.delete()


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def login_failure_record(*, username: str, address: str) -> LoginFailure:
    """A failed sign-in: counted towards the lockout, logged, and kept for the admins."""
    username = username[:150]
    lockout = login_throttle.failure_record(username=username, address=address)
    # %r: both come from the client; repr keeps a forged newline out of the log.
    logger.warning(
        "sign-in failed: %r from %r%s",
        username[:64],
        address,
        f" (locked out for {lockout} s)" if lockout else "",
    )
    return LoginFailure.objects.create(username=username, address=address[:64])


def login_failures_prune(*, keep_days: int | None = None) -> int:
    """Forget failed sign-ins older than ``keep_days`` (``FLEET_LOGIN_FAILURES_KEEP_DAYS``)."""
    days = keep_days if keep_days is not None else settings.FLEET_LOGIN_FAILURES_KEEP_DAYS
    deleted, _ = LoginFailure.objects.filter(at__lt=timezone.now() - timedelta(days=days)).delete()
    return deleted
