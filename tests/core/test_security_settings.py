"""Production hardening: HSTS, HTTPS behind a proxy, no DEBUG, a clean ``check --deploy``, a
Content-Security-Policy on every response, short sessions, and an embedded secret key of its own
per data directory."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.settings.secret_key import embedded_secret_key

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = {
    "FLEET_MODE": "production",
    "FLEET_SECRET_KEY": "k" * 10 + "ZmFrZS1idXQtbG9uZy1lbm91Z2gtc2VjcmV0LWtleS1mb3ItdGVzdHM",
    "FLEET_SECRETS_KEY": "dGVzdHMtb25seS1mZXJuZXQta2V5LTMyLWJ5dGVzLSE=",
    "FLEET_DATABASE_URL": "postgres://fleet:x@db.invalid:5432/fleet",
    "FLEET_REDIS_URL": "redis://redis.invalid:6379/0",
    "FLEET_ALLOWED_HOSTS": "fleet.example.com",
}
SHOW_SETTINGS = (
    "import django, json; django.setup(); from django.conf import settings as s; "
    "print(json.dumps([s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, "
    "s.SECURE_SSL_REDIRECT, s.SECURE_PROXY_SSL_HEADER, s.SESSION_COOKIE_AGE, s.DEBUG]))"
)
SHOW_KEY = (
    "import django; django.setup(); from django.conf import settings; print(settings.SECRET_KEY)"
)


def run_django(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "DJANGO_"))}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "fleet.settings.base", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_in_production_with_the_required_settings():
    done = run_django(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **PRODUCTION)
    assert done.returncode == 0, done.stdout + done.stderr


def test_production_defaults_to_a_year_of_hsts_and_half_a_day_sessions():
    done = run_django(["-c", SHOW_SETTINGS], **PRODUCTION)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [31_536_000, False, False, None, 43_200, False]


def test_https_behind_a_proxy_is_opt_in(tmp_path):
    done = run_django(
        ["-c", SHOW_SETTINGS],
        **PRODUCTION,
        FLEET_HSTS_SECONDS="600",
        FLEET_HSTS_INCLUDE_SUBDOMAINS="true",
        FLEET_SSL_REDIRECT="true",
        FLEET_SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https",
        FLEET_SESSION_SECONDS="3600",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        600,
        True,
        True,
        ["HTTP_X_FORWARDED_PROTO", "https"],
        3600,
        False,
    ]


def test_a_malformed_proxy_header_setting_stops_the_start():
    done = run_django(["-c", SHOW_SETTINGS], **PRODUCTION, FLEET_SECURE_PROXY_SSL_HEADER="https")
    assert done.returncode != 0 and "FLEET_SECURE_PROXY_SSL_HEADER" in done.stderr


def test_debug_is_refused_in_production():
    done = run_django(["manage.py", "check"], **PRODUCTION, FLEET_DEBUG="true")
    assert done.returncode != 0
    assert "FLEET_DEBUG=true is refused when FLEET_MODE=production" in done.stderr


def test_the_embedded_mode_generates_one_private_secret_key_per_data_directory(tmp_path):
    first = run_django(["-c", SHOW_KEY], FLEET_DATA_DIR=str(tmp_path / "a"))
    again = run_django(["-c", SHOW_KEY], FLEET_DATA_DIR=str(tmp_path / "a"))
    other = run_django(["-c", SHOW_KEY], FLEET_DATA_DIR=str(tmp_path / "b"))
    assert first.returncode == 0, first.stderr
    key = first.stdout.strip()
    assert len(key) >= 50 and key == again.stdout.strip() != other.stdout.strip()
    assert "insecure" not in key
    key_file = tmp_path / "a" / "secret_key"
    assert key_file.read_text().strip() == key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_a_set_secret_key_wins_over_the_generated_one(tmp_path):
    done = run_django(["-c", SHOW_KEY], FLEET_DATA_DIR=str(tmp_path), FLEET_SECRET_KEY="mine" * 13)
    assert done.stdout.strip() == "mine" * 13 and not (tmp_path / "secret_key").exists()


def test_the_secret_key_file_is_kept_and_a_truncated_one_is_refused(tmp_path):
    from django.core.exceptions import ImproperlyConfigured

    key = embedded_secret_key(tmp_path)
    assert embedded_secret_key(tmp_path) == key
    assert [p.name for p in tmp_path.iterdir()] == ["secret_key"]  # no temporary file left
    (tmp_path / "secret_key").write_text("short")
    with pytest.raises(ImproperlyConfigured, match="delete it"):
        embedded_secret_key(tmp_path)


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/login/", "/healthz", "/api/v1/me", "/static/web/core.js"])
def test_every_response_carries_a_csp_that_allows_scripts_from_our_origin_only(client, url):
    policy = client.get(url)["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'" and directives["default-src"] == "'self'"


@pytest.mark.django_db
def test_the_api_docs_load_their_init_script_from_our_origin(viewer):
    from django.test import Client

    client = Client()
    client.force_login(viewer)
    page = client.get("/api/docs/").content.decode()
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, flags=re.S)
    assert scripts and all('src="' in attrs and not body.strip() for attrs, body in scripts)
    init = client.get("/api/docs/?script=")
    assert init.status_code == 200 and b"SwaggerUIBundle" in init.content


def test_no_template_has_an_inline_script_or_an_event_handler_attribute():
    for template in (ROOT / "templates").rglob("*.html"):
        text = template.read_text()
        for attrs in re.findall(r"<script([^>]*)>", text):
            assert "src=" in attrs, template
        assert not re.search(r"\son[a-z]+\s*=", text), template


def test_sessions_last_twelve_hours_and_messages_stay_in_the_session(settings):
    assert settings.SESSION_COOKIE_AGE == 12 * 3600
    assert settings.MESSAGE_STORAGE.endswith("session.SessionStorage")
