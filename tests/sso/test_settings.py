"""Single sign-on is off unless configured, and bad configuration stops Fleet at start with a
clear message (not at the first sign-in)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_sso_is_off_by_default_and_each_bad_setting_stops_the_start_with_its_reason(tmp_path):
    data = {"FLEET_DATA_DIR": str(tmp_path)}
    assert start(**data).stdout.split() == ["False", "False", "True"]
    for env, reason in [
        ({"FLEET_SSO_GROUP_MAP": '{"g": "root"}'}, "'root' is not a fleet role"),
        ({"FLEET_LOCAL_LOGIN": "off"}, "needs FLEET_BREAK_GLASS_USER"),
        ({"FLEET_OIDC_ISSUER": "https://id.example.com"}, "set FLEET_OIDC_CLIENT_ID"),
        ({"FLEET_LDAP_SERVER_URI": "ldap://ldap.example.com"}, "FLEET_LDAP_USER_SEARCH_BASE"),
    ]:
        result = start(**data, **env)
        assert result.returncode != 0
        assert "ImproperlyConfigured" in result.stderr and reason in result.stderr, env
