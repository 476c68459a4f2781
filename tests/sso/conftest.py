"""Fixtures for single sign-on: the group map every test uses, a real slapd per test, and
the LDAP settings pointing at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.core.sso.mapping import group_map_parse
from tests.sso.slapd import (
    GROUPS,
    PEOPLE,
    POSIX_GROUPS,
    ROOT_DN,
    ROOT_PASSWORD,
    Directory,
    running_slapd,
)

GROUP_MAP = (
    '{"gpu-admins": "admin", "gpu-viewers": "viewer",'
    ' "team-search": {"team": "search", "role": "operator"},'
    ' "team-ml": [{"team": "ml", "role": "viewer"}]}'
)
# "Disabled" the way a directory without a lock flag says it: excluded by the filter.
USER_FILTER = "(&(uid=%(user)s)(!(description=disabled)))"


@pytest.fixture
def group_map(settings: Any) -> None:
    settings.FLEET_SSO_GROUP_MAP = group_map_parse(GROUP_MAP)


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[Directory]:
    with running_slapd(tmp_path / "slapd") as running:
        yield running


def ldap_configure(settings: Any, directory: Directory, **choices: str) -> Directory:
    from fleet.core.sso.ldap_config import ldap_settings

    settings.FLEET_LDAP_ENABLED = True
    backends = list(settings.AUTHENTICATION_BACKENDS)
    backends.insert(1, "fleet.core.sso.ldap.LdapBackend")  # as fleet.settings.sso does
    settings.AUTHENTICATION_BACKENDS = backends
    for name, value in ldap_settings(
        server_uri=directory.uri,
        bind_dn=ROOT_DN,
        bind_password=ROOT_PASSWORD,
        user_search_base=PEOPLE,
        user_filter=USER_FILTER,
        **({"group_search_base": GROUPS} | choices),
    ).items():
        setattr(settings, name, value)
    return directory


@pytest.fixture
def ldap_on(settings: Any, directory: Directory, group_map: None) -> Directory:
    """LDAP sign-in, groups as groupOfNames (the default FLEET_LDAP_GROUP_TYPE)."""
    return ldap_configure(settings, directory)


@pytest.fixture
def ldap_posix_on(settings: Any, directory: Directory, group_map: None) -> Directory:
    """LDAP sign-in, groups as posixGroup (FLEET_LDAP_GROUP_TYPE=posixGroup)."""
    return ldap_configure(
        settings, directory, group_search_base=POSIX_GROUPS, group_type="posixGroup"
    )
