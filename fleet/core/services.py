"""Writes for users, roles and API tokens."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from fleet.core.authentication import USER_TOKEN_KIND
from fleet.core.models import ApiToken
from fleet.core.roles import GROUP_NAMES, Role
from fleet.core.tokens import hash_token, new_token, token_prefix


def roles_ensure() -> None:
    for name in GROUP_NAMES.values():
        Group.objects.get_or_create(name=name)


@transaction.atomic
def user_create(*, username: str, password: str | None, role: Role, email: str = "") -> Any:
    """Create (or update) a user holding exactly ``role``."""
    roles_ensure()
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=username, defaults={"email": email})
    if password is not None:
        user.set_password(password)
    # Admins run the Django admin too (hosts, enrollment tokens, users): full rights there.
    user.is_staff = user.is_superuser = role >= Role.ADMIN
    user.save()
    user.groups.set(Group.objects.filter(name=GROUP_NAMES[role]))
    return user


def api_token_create(*, user: Any, name: str) -> tuple[ApiToken, str]:
    """A new API token for ``user``; the returned secret is never stored and never shown again."""
    secret = new_token(USER_TOKEN_KIND)
    token = ApiToken.objects.create(
        user=user, name=name, prefix=token_prefix(secret), key_hash=hash_token(secret)
    )
    return token, secret
