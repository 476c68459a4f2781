"""The test OIDC provider (:mod:`tests.sso.provider`) in its own process on a free loopback
port, and a browserless walk through its sign-in page (``requests``)."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

import jwt
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwcrypto.jwk import JWK

from tests.sso.slapd import free_port

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID = "fleet-tests"
CLIENT_SECRET = "fleet-tests-secret-" + "s" * 24
USERS = {
    "dana": {"password": "dana-pw", "email": "dana@idp.test", "groups": ["team-search"]},
    "erin": {"password": "erin-pw", "email": "erin@idp.test", "groups": ["gpu-admins"]},
}


@dataclass
class Provider:
    issuer: str
    state: Path
    private_pem: bytes

    def set_groups(self, username: str, groups: list[str]) -> None:
        """Change a user's groups in the provider's own database."""
        with sqlite3.connect(self.state / "db.sqlite3") as db:
            (user_id,) = db.execute(
                "SELECT id FROM auth_user WHERE username = ?", (username,)
            ).fetchone()
            db.execute("DELETE FROM auth_user_groups WHERE user_id = ?", (user_id,))
            for group in groups:
                db.execute("INSERT OR IGNORE INTO auth_group (name) VALUES (?)", (group,))
                (group_id,) = db.execute(
                    "SELECT id FROM auth_group WHERE name = ?", (group,)
                ).fetchone()
                db.execute(
                    "INSERT INTO auth_user_groups (user_id, group_id) VALUES (?, ?)",
                    (user_id, group_id),
                )

    def subject_of(self, username: str) -> str:
        with sqlite3.connect(self.state / "db.sqlite3") as db:
            row = db.execute("SELECT id FROM auth_user WHERE username = ?", (username,))
            return str(row.fetchone()[0])

    def sign(self, claims: dict[str, object]) -> str:
        """A JWT signed with the provider's own key (as its back-channel logout would be)."""
        kid = JWK.from_pem(self.private_pem).thumbprint()
        return jwt.encode(claims, self.private_pem, algorithm="RS256", headers={"kid": kid})


GROUP_MAP = '{"gpu-admins": "admin", "team-search": {"team": "search", "role": "operator"}}'


def sso_env(port: int) -> dict[str, str]:
    """The FLEET_* variables of a Fleet server that signs in through this provider on
    ``port`` (started later: Fleet reads the provider's discovery document on first use)."""
    return {
        "FLEET_OIDC_ISSUER": f"http://127.0.0.1:{port}/o",
        "FLEET_OIDC_CLIENT_ID": CLIENT_ID,
        "FLEET_OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "FLEET_OIDC_SCOPES": "openid email profile groups",
        "FLEET_OIDC_PROVIDER_NAME": "Test IdP",
        "FLEET_SSO_GROUP_MAP": GROUP_MAP,
    }


@contextmanager
def running_provider(
    state: Path,
    redirect_uris: list[str],
    port: int | None = None,
    post_logout_redirect_uris: list[str] | None = None,
) -> Iterator[Provider]:
    state.mkdir(parents=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    (state / "rsa.pem").write_bytes(pem)
    port = port or free_port()
    config = {
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "redirect_uris": redirect_uris,
        "post_logout_redirect_uris": post_logout_redirect_uris or [],
        "users": USERS,
    }
    log = (state / "provider.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.sso.provider.serve",
            str(state),
            str(port),
            json.dumps(config),
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    issuer = f"http://127.0.0.1:{port}/o"
    try:
        _wait_until_serving(process, issuer, state)
        yield Provider(issuer=issuer, state=state, private_pem=pem)
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def _wait_until_serving(process: subprocess.Popen[bytes], issuer: str, state: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the provider exited: {(state / 'provider.log').read_text()}")
        try:
            if requests.get(f"{issuer}/.well-known/openid-configuration", timeout=2).ok:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the provider did not start in 60 s")


def provider_sign_in(
    authorize_url: str,
    username: str,
    password: str,
    *,
    until: str,
    session: requests.Session | None = None,
) -> str:
    """Follow the provider's redirects as a browser would, signing in on its page, until one
    leads to ``until`` (Fleet's callback); that URL (with the code) is returned. ``session``:
    the browser's cookies at the provider (a new one by default)."""
    session = session or requests.Session()
    url = authorize_url
    for _ in range(10):
        response = session.get(url, allow_redirects=False, timeout=10)
        if response.status_code == 200 and "csrfmiddlewaretoken" in response.text:
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.text)
            assert token is not None
            next_url = re.search(r'name="next" value="([^"]*)"', response.text)
            response = session.post(
                url,
                data={
                    "csrfmiddlewaretoken": token.group(1),
                    "username": username,
                    "password": password,
                    "next": next_url.group(1).replace("&amp;", "&") if next_url else "",
                },
                headers={"Referer": url},
                allow_redirects=False,
                timeout=10,
            )
        assert response.status_code in (301, 302), (response.status_code, response.text[:300])
        url = urljoin(url, response.headers["Location"])
        if url.startswith(until):
            return url
    raise AssertionError("the provider never sent the browser back")
