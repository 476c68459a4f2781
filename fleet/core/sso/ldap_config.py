"""django-auth-ldap's settings from Fleet's ``FLEET_LDAP_*`` choices (read by
:mod:`fleet.settings.sso`; no Django app is loaded here)."""

from __future__ import annotations

from typing import Any

import ldap
from django_auth_ldap.config import GroupOfNamesType, LDAPSearch


def ldap_settings(
    *,
    server_uri: str,
    bind_dn: str = "",
    bind_password: str = "",
    user_search_base: str,
    user_filter: str = "(uid=%(user)s)",
    group_search_base: str = "",
    group_filter: str = "(objectClass=groupOfNames)",
    start_tls: bool = False,
) -> dict[str, Any]:
    """django-auth-ldap's ``AUTH_LDAP_*`` settings from Fleet's few choices (groups are
    ``groupOfNames`` entries, named by their ``cn``)."""
    found: dict[str, Any] = {
        "AUTH_LDAP_SERVER_URI": server_uri,
        "AUTH_LDAP_BIND_DN": bind_dn,
        "AUTH_LDAP_BIND_PASSWORD": bind_password,
        "AUTH_LDAP_START_TLS": start_tls,
        "AUTH_LDAP_USER_SEARCH": LDAPSearch(user_search_base, ldap.SCOPE_SUBTREE, user_filter),
        "AUTH_LDAP_USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
        "AUTH_LDAP_ALWAYS_UPDATE_USER": True,
        "AUTH_LDAP_CONNECTION_OPTIONS": {ldap.OPT_NETWORK_TIMEOUT: 10, ldap.OPT_TIMEOUT: 10},
    }
    if group_search_base:
        found["AUTH_LDAP_GROUP_SEARCH"] = LDAPSearch(
            group_search_base, ldap.SCOPE_SUBTREE, group_filter
        )
        found["AUTH_LDAP_GROUP_TYPE"] = GroupOfNamesType()
    return found
