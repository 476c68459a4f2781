"""OIDC sign-in through a real provider (django-oauth-toolkit in its own process): the groups
claim sets the fleet role and team roles at each sign-in, a local account is never taken over,
a provider that cannot be reached leaves local sign-in working, and a back-channel logout
signed by the provider revokes the user's API tokens and sessions."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth import get_user_model
from django.test import Client

from fleet.core.models import ApiToken, SsoIdentity, TeamMembership
from fleet.core.roles import Role, role_of
from fleet.core.sso import discovery
from fleet.core.tokens import hash_token, new_token
from tests.sso.oidc_provider import (
    CLIENT_ID,
    CLIENT_SECRET,
    USERS,
    Provider,
    provider_sign_in,
    running_provider,
)

# One worker runs them all under xdist: one provider process, started once.
pytestmark = [pytest.mark.django_db, pytest.mark.xdist_group("sso-provider")]
CALLBACK = "http://testserver/oidc/callback/"
SIGNED_OUT = "http://testserver/login/"
LOGOUT_EVENT = {"http://schemas.openid.net/event/backchannel-logout": {}}


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    with running_provider(
        tmp_path_factory.mktemp("idp") / "state",
        [CALLBACK],
        post_logout_redirect_uris=[SIGNED_OUT],
    ) as running:
        yield running


@pytest.fixture
def oidc_on(settings: Any, provider: Provider, group_map: None) -> Iterator[Provider]:
    settings.FLEET_OIDC_ENABLED = True
    settings.FLEET_OIDC_ISSUER = provider.issuer
    settings.FLEET_OIDC_PROVIDER_NAME = "Test IdP"
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_RP_SCOPES = "openid email profile groups"
    discovery.forget()
    yield provider
    discovery.forget()
    for name, spec in USERS.items():
        provider.set_groups(name, spec["groups"])


def oidc_sign_in(username: str, browser: requests.Session | None = None) -> tuple[Client, Any]:
    client = Client()
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302, start.content[:300]
    back = provider_sign_in(
        start["Location"], username, USERS[username]["password"], until=CALLBACK, session=browser
    )
    return client, client.get(back.removeprefix("http://testserver"))


def test_the_sign_in_page_offers_the_provider_only_when_configured(settings, oidc_on):
    assert b"Sign in with Test IdP" in Client().get("/login/").content
    settings.FLEET_OIDC_ENABLED = False
    assert b"Sign in with" not in Client().get("/login/").content
    assert Client().get("/oidc/authenticate/").status_code == 404


def test_a_user_signs_in_through_the_provider_with_the_roles_of_their_groups(oidc_on):
    client, landed = oidc_sign_in("dana")

    assert landed.status_code == 302 and landed["Location"] == "/"
    dana = get_user_model().objects.get(username="dana")
    assert role_of(dana) == Role.MEMBER
    assert dict(TeamMembership.objects.filter(user=dana).values_list("team__slug", "role")) == {
        "search": "operator"
    }
    assert dana.email == "dana@idp.test" and not dana.has_usable_password()
    assert SsoIdentity.objects.get(user=dana).subject == oidc_on.subject_of("dana")
    assert client.get("/").status_code == 200


def test_a_group_changed_at_the_provider_changes_the_rights_at_the_next_sign_in(oidc_on):
    oidc_sign_in("erin")
    erin = get_user_model().objects.get(username="erin")
    assert role_of(erin) == Role.ADMIN
    oidc_on.set_groups("erin", ["gpu-viewers"])

    oidc_sign_in("erin")

    assert role_of(get_user_model().objects.get(username="erin")) == Role.VIEWER


def test_a_local_account_of_the_same_name_is_not_taken_over(oidc_on, make_user):
    local = make_user("admin", "erin")

    _, landed = oidc_sign_in("erin")

    assert landed.status_code == 302 and landed["Location"] == "/login/?sso=failed"
    assert not SsoIdentity.objects.filter(user=local).exists()
    assert b"Single sign-on did not sign you in" in Client().get("/login/?sso=failed").content


def test_local_sign_in_works_while_the_provider_cannot_be_reached(settings, oidc_on, make_user):
    settings.FLEET_OIDC_ISSUER = "http://127.0.0.1:1/o"
    local = make_user("viewer", "frank")
    local.set_password("frank-pw-123")
    local.save()

    assert Client().get("/oidc/authenticate/")["Location"] == "/login/?sso=failed"
    signed_in = Client().post("/login/", {"username": "frank", "password": "frank-pw-123"})
    assert signed_in.status_code == 302


def _logout_token(provider: Provider, **changes: Any) -> str:
    claims = {
        "iss": provider.issuer,
        "aud": CLIENT_ID,
        "iat": int(time.time()),
        "jti": "logout-1",
        "sub": provider.subject_of("dana"),
        "events": LOGOUT_EVENT,
        **changes,
    }
    return provider.sign({k: v for k, v in claims.items() if v is not None})


def test_a_back_channel_logout_revokes_the_users_tokens_and_sessions(oidc_on):
    client, _ = oidc_sign_in("dana")
    dana = get_user_model().objects.get(username="dana")
    key = new_token("fla")
    ApiToken.objects.create(user=dana, name="ci", prefix="x", key_hash=hash_token(key))
    assert Client().get("/api/v1/hosts/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200

    done = Client().post("/oidc/backchannel-logout/", {"logout_token": _logout_token(oidc_on)})

    assert done.status_code == 200
    assert Client().get("/api/v1/hosts/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 401
    assert client.get("/").status_code == 302  # the session ended
    oidc_sign_in("dana")  # and the user may sign in again
    assert get_user_model().objects.get(username="dana").is_active


@pytest.mark.parametrize(
    "changes",
    [
        {"aud": "another-client"},
        {"events": None},
        {"nonce": "n"},
        {"iat": int(time.time()) - 3600},
        {"iss": "http://127.0.0.1:1/o"},
    ],
)
def test_a_logout_token_that_does_not_verify_changes_nothing(oidc_on, changes):
    oidc_sign_in("dana")
    dana = get_user_model().objects.get(username="dana")
    ApiToken.objects.create(user=dana, name="ci", prefix="x", key_hash=hash_token("k"))

    refused = Client().post(
        "/oidc/backchannel-logout/", {"logout_token": _logout_token(oidc_on, **changes)}
    )

    assert refused.status_code == 400
    assert refused.json()["code"] == "sso.logout_token_invalid"
    assert ApiToken.objects.filter(user=dana).exists()


def test_a_logout_token_signed_by_another_key_changes_nothing(oidc_on, tmp_path):
    oidc_sign_in("dana")
    forged = Provider(issuer=oidc_on.issuer, state=oidc_on.state, private_pem=_other_key())
    ApiToken.objects.create(
        user=get_user_model().objects.get(username="dana"), name="ci", prefix="x", key_hash="h"
    )

    refused = Client().post("/oidc/backchannel-logout/", {"logout_token": _logout_token(forged)})

    assert refused.status_code == 400
    assert ApiToken.objects.filter(user__username="dana").exists()


def test_tokens_with_unknown_keys_do_not_make_fleet_call_the_provider_each_time(oidc_on):
    oidc_sign_in("dana")  # the provider's keys are read once here
    forged = Provider(issuer=oidc_on.issuer, state=oidc_on.state, private_pem=_other_key())
    log = oidc_on.state / "provider.log"
    before = log.read_text().count("jwks")

    for _ in range(5):
        token = _logout_token(forged)
        assert (
            Client().post("/oidc/backchannel-logout/", {"logout_token": token}).status_code == 400
        )

    assert log.read_text().count("jwks") - before <= 1  # one re-read: keys may have rotated


def _other_key() -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def test_signing_out_of_fleet_ends_the_session_at_the_provider_too(oidc_on):
    browser = requests.Session()  # the browser's cookies at the provider
    client, signed_in = oidc_sign_in("dana", browser)
    assert signed_in.status_code == 302 and client.get("/").status_code == 200
    id_token = client.session["oidc_id_token"]

    out = client.post("/logout/")

    # Fleet's session is over, and the browser goes on to the provider's end_session_endpoint.
    assert client.get("/").status_code == 302
    assert out.status_code == 302
    at_provider = urlsplit(out["Location"])
    assert out["Location"].startswith(f"{oidc_on.issuer}/logout/"), out["Location"]
    query = parse_qs(at_provider.query)
    assert query["id_token_hint"] == [id_token]
    assert query["post_logout_redirect_uri"] == [SIGNED_OUT]
    assert query["client_id"] == [CLIENT_ID]
    # The provider accepts the hint, ends its session and sends the browser back to Fleet.
    back = browser.get(out["Location"], allow_redirects=False, timeout=10)
    assert back.status_code == 302, back.text[:300]
    assert back.headers["Location"] == SIGNED_OUT
    again = browser.get(f"{oidc_on.issuer}/authorize/?client_id={CLIENT_ID}", timeout=10)
    assert "csrfmiddlewaretoken" in again.text  # its sign-in page: no session there any more


def test_sign_out_stays_at_fleet_when_provider_logout_is_off_or_the_sign_in_was_local(
    settings, oidc_on, make_user
):
    settings.FLEET_OIDC_PROVIDER_LOGOUT = False
    client, _ = oidc_sign_in("dana")
    out = client.post("/logout/")
    assert (out.status_code, out["Location"]) == (302, "/login/")

    settings.FLEET_OIDC_PROVIDER_LOGOUT = True
    local = make_user("viewer", "dave")
    local.set_password("local-pw-123")
    local.save()
    client = Client()
    assert (
        client.post("/login/", {"username": "dave", "password": "local-pw-123"}).status_code == 302
    )
    out = client.post("/logout/")
    assert (out.status_code, out["Location"]) == (302, "/login/")
