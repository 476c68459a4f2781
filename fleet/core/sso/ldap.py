"""LDAP sign-in through django-auth-ldap, and the sync that the beat runs
(``fleet.sso_ldap_sync``, every ``FLEET_LDAP_SYNC_SECONDS``).

A user signs in with their directory password; their groups (``groupOfNames`` entries under
``FLEET_LDAP_GROUP_SEARCH_BASE``, named by ``cn``) set their roles. The sync asks the directory
about every LDAP user Fleet knows: one it no longer finds with ``FLEET_LDAP_USER_FILTER``
(deleted, or excluded by the filter: that is how a directory says "disabled", e.g.
``(&(uid=%(user)s)(!(pwdAccountLockedTime=*)))``) loses its API tokens and sessions and is
deactivated; the others get the roles of their current groups.
"""

from __future__ import annotations

import logging
from typing import Any

import ldap
from django.conf import settings
from django.http import HttpRequest
from django_auth_ldap.backend import LDAPBackend

from fleet.core.models import SsoIdentity, SsoSource
from fleet.core.sso.sync import sso_identity_claim, sso_user_revoke, sso_user_sync

logger = logging.getLogger(__name__)


class LdapBackend(LDAPBackend):  # type: ignore[misc]
    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if not settings.FLEET_LDAP_ENABLED or not username or not password:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)

    def get_or_build_user(self, username: str, ldap_user: Any) -> tuple[Any, bool]:
        user, built = super().get_or_build_user(username, ldap_user)
        if not sso_identity_claim(user=user, source=SsoSource.LDAP, subject=user.username):
            # A local account (or an OIDC one) of the same name is never taken over.
            raise ldap_user.AuthenticationFailed(f"{username!r} is not an LDAP account here")
        return user, built

    def authenticate_ldap_user(self, ldap_user: Any, password: str) -> Any:
        user = ldap_user.authenticate(password)
        if user is not None:
            sso_user_sync(
                user=user,
                source=SsoSource.LDAP,
                subject=user.username,
                groups=ldap_user.group_names,
            )
        return user

    def get_user(self, user_id: Any) -> Any:
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None


def _directory(config: Any) -> Any:
    """A connection bound as ``FLEET_LDAP_BIND_DN``; raises ``ldap.LDAPError``."""
    connection = ldap.initialize(config.SERVER_URI)
    for option, value in config.CONNECTION_OPTIONS.items():
        connection.set_option(option, value)
    if config.START_TLS:
        connection.start_tls_s()
    connection.simple_bind_s(config.BIND_DN, config.BIND_PASSWORD)
    return connection


def ldap_users_sync() -> dict[str, int]:
    """Ask the directory about each active LDAP user: gone -> revoked and deactivated,
    present -> roles from their current groups. When the directory cannot be reached the
    sync stops and changes nothing more (logged): an outage must not lock everyone out."""
    counts = {"synced": 0, "disabled": 0, "errors": 0}
    if not settings.FLEET_LDAP_ENABLED:
        return counts
    backend = LdapBackend()
    identities = SsoIdentity.objects.filter(source=SsoSource.LDAP, user__is_active=True)
    try:
        directory = _directory(backend.settings)
        for identity in identities.select_related("user").order_by("pk").iterator():
            # The search itself, not populate_user(), which reads an error as "not found".
            if not backend.settings.USER_SEARCH.execute(directory, {"user": identity.subject}):
                sso_user_revoke(user=identity.user, reason="not found in LDAP", disable=True)
                counts["disabled"] += 1
                continue
            found = backend.populate_user(identity.subject)
            if found is not None:
                _ldap_sync(found, identity.subject, found.ldap_user.group_names)
                counts["synced"] += 1
        directory.unbind_s()
    except ldap.LDAPError as error:
        logger.warning("LDAP sync stopped, directory unreachable: %s", error)
        counts["errors"] += 1
    return counts


def _ldap_sync(user: Any, subject: str, groups: Any) -> None:
    sso_user_sync(user=user, source=SsoSource.LDAP, subject=subject, groups=groups)
