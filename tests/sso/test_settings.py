"""Single sign-on is off unless configured, and bad configuration stops Fleet at start with a
clear message (not at the first sign-in)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

import fleet.settings.sso

ROOT = Path(__file__).resolve().parents[2]
SHOW = (
    "import django; django.setup(); from django.conf import settings as s; "
    "print(s.FLEET_OIDC_ENABLED, s.FLEET_LDAP_ENABLED, s.FLEET_LOCAL_LOGIN)"
)


def start(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return subprocess.run(
        [sys.executable, "-c", SHOW],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "fleet.settings.base", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_sso_is_off_by_default_and_a_bad_group_map_stops_the_start(tmp_path):
    assert start(FLEET_DATA_DIR=str(tmp_path)).stdout.split() == ["False", "False", "True"]
    bad = start(FLEET_DATA_DIR=str(tmp_path), FLEET_SSO_GROUP_MAP='{"g": "root"}')
    assert bad.returncode != 0
    assert "ImproperlyConfigured: FLEET_SSO_GROUP_MAP['g']: 'root' is not a fleet role" in (
        bad.stderr
    )


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"FLEET_LOCAL_LOGIN": "off"}, "needs FLEET_BREAK_GLASS_USER"),
        ({"FLEET_OIDC_ISSUER": "https://id.example.com"}, "set FLEET_OIDC_CLIENT_ID"),
        ({"FLEET_LDAP_SERVER_URI": "ldap://ldap.example.com"}, "FLEET_LDAP_USER_SEARCH_BASE"),
        (
            {
                "FLEET_LDAP_SERVER_URI": "ldap://ldap.example.com",
                "FLEET_LDAP_USER_SEARCH_BASE": "ou=people,dc=example,dc=com",
                "FLEET_LDAP_GROUP_TYPE": "posix",
            },
            "FLEET_LDAP_GROUP_TYPE must be one of groupOfNames, .*posixGroup",
        ),
    ],
)
def test_a_half_configured_sign_in_stops_the_start_with_its_reason(monkeypatch, env, reason):
    for name in [n for n in os.environ if n.startswith(("FLEET_OIDC", "FLEET_LDAP", "FLEET_SSO"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        with pytest.raises(ImproperlyConfigured, match=reason):
            importlib.reload(fleet.settings.sso)  # what the start runs
    finally:
        monkeypatch.undo()
        importlib.reload(fleet.settings.sso)
