"""django-auth-ldap's settings from Fleet's ``FLEET_LDAP_*`` choices (read by
:mod:`fleet.settings.sso`; no Django app is loaded here)."""

from __future__ import annotations

from typing import Any

import ldap
from django_auth_ldap.config import (
    ActiveDirectoryGroupType,
    GroupOfNamesType,
    GroupOfUniqueNamesType,
    LDAPGroupType,
    LDAPSearch,
    NestedActiveDirectoryGroupType,
    NestedGroupOfNamesType,
    PosixGroupType,
)

# FLEET_LDAP_GROUP_TYPE: how the directory says who is in a group, and the filter that finds
# its groups unless FLEET_LDAP_GROUP_FILTER says otherwise. The nested kinds follow groups in
# groups (one search per level).
GROUP_TYPES: dict[str, tuple[type[LDAPGroupType], str]] = {
    # member: the members' DNs (OpenLDAP, 389 Directory Server, FreeIPA)
    "groupOfNames": (GroupOfNamesType, "(objectClass=groupOfNames)"),
    "nestedGroupOfNames": (NestedGroupOfNamesType, "(objectClass=groupOfNames)"),
    # uniqueMember: the members' DNs
    "groupOfUniqueNames": (GroupOfUniqueNamesType, "(objectClass=groupOfUniqueNames)"),
    # memberUid: the members' uid, and their primary group by gidNumber (NIS, RFC 2307)
    "posixGroup": (PosixGroupType, "(objectClass=posixGroup)"),
    # Active Directory: member, the members' DNs
    "activeDirectory": (ActiveDirectoryGroupType, "(objectClass=group)"),
    "nestedActiveDirectory": (NestedActiveDirectoryGroupType, "(objectClass=group)"),
}


def ldap_settings(
    *,
    server_uri: str,
    bind_dn: str = "",
    bind_password: str = "",
    user_search_base: str,
    user_filter: str = "(uid=%(user)s)",
    group_search_base: str = "",
    group_filter: str = "",
    group_type: str = "groupOfNames",
    start_tls: bool = False,
) -> dict[str, Any]:
    """django-auth-ldap's ``AUTH_LDAP_*`` settings from Fleet's few choices (groups are entries
    of ``group_type``, one of :data:`GROUP_TYPES`, named by their ``cn``; ``group_filter``:
    that type's own unless given). ``ValueError`` for an unknown type."""
    if group_type not in GROUP_TYPES:
        raise ValueError(
            f"FLEET_LDAP_GROUP_TYPE must be one of {', '.join(GROUP_TYPES)}, not {group_type!r}"
        )
    kind, default_filter = GROUP_TYPES[group_type]
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
            group_search_base, ldap.SCOPE_SUBTREE, group_filter or default_filter
        )
        found["AUTH_LDAP_GROUP_TYPE"] = kind()
    return found
