"""OIDC sign-in (authorization code flow with PKCE) through mozilla-django-oidc.

Why mozilla-django-oidc rather than django-allauth: Fleet needs one relying party for one
provider, mapped onto its own users, roles and teams. mozilla-django-oidc is that and little
more (a backend, two views, explicit settings), so discovery, the group map and the
back-channel logout are a few small subclasses here; allauth brings account management, sign-up
flows, e-mail verification and dozens of providers Fleet would have to turn off.

The user is found by the identity (``sub``) it signed in with before, else created under its
``preferred_username`` (``FLEET_OIDC_USERNAME_CLAIM``); a local account with that name is never
taken over. At each sign-in the groups claim (``FLEET_OIDC_GROUPS_CLAIM``) sets the user's
roles (:func:`fleet.core.sso.sync.sso_user_sync`).
"""

from __future__ import annotations

import logging
from typing import Any

import jwt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.generic import View
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView
from requests import RequestException
from requests.models import PreparedRequest

from fleet.core.models import SsoIdentity, SsoSource
from fleet.core.sso import discovery
from fleet.core.sso.sync import sso_identity_claim, sso_user_sync

logger = logging.getLogger(__name__)

ENDPOINT_SETTINGS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
MAX_GROUPS = 1000


def oidc_setting(attr: str, *default: Any) -> Any:
    """mozilla-django-oidc's settings, with the endpoints from discovery."""
    if attr in ENDPOINT_SETTINGS:
        return discovery.endpoint(ENDPOINT_SETTINGS[attr])
    return import_from_settings(attr, *default)


def groups_of(claims: dict[str, Any]) -> list[str]:
    value = claims.get(settings.FLEET_OIDC_GROUPS_CLAIM, [])
    if not isinstance(value, list):
        return []
    return [g for g in value[:MAX_GROUPS] if isinstance(g, str)]


class OidcBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Django builds every backend for each password sign-in and each session: the
        # endpoints are read when an OIDC sign-in needs them, not here.
        self.UserModel = get_user_model()

    OIDC_OP_TOKEN_ENDPOINT = property(lambda self: discovery.endpoint("token_endpoint"))
    OIDC_OP_USER_ENDPOINT = property(lambda self: discovery.endpoint("userinfo_endpoint"))
    OIDC_OP_JWKS_ENDPOINT = property(lambda self: discovery.endpoint("jwks_uri"))
    OIDC_RP_CLIENT_ID = property(lambda self: settings.OIDC_RP_CLIENT_ID)
    OIDC_RP_CLIENT_SECRET = property(lambda self: settings.OIDC_RP_CLIENT_SECRET)
    OIDC_RP_SIGN_ALGO = property(lambda self: settings.OIDC_RP_SIGN_ALGO)
    OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        if not settings.FLEET_OIDC_ENABLED or request is None:
            return None
        try:
            return super().authenticate(request, **kwargs)
        except (RequestException, ImproperlyConfigured) as error:
            logger.warning("OIDC sign-in failed: %s", error)
            return None

    def get_user(self, user_id: Any) -> Any:
        user = super().get_user(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None

    def retrieve_matching_jwk(self, token: str) -> Any:
        """The provider's key that signed ``token``, from the cached key set (read again once
        when the key id is new: the provider rotated its keys)."""
        header = jwt.get_unverified_header(token)
        for refresh in (False, True):
            for key in discovery.jwks(refresh=refresh)["keys"]:
                same_kid = isinstance(key, dict) and key.get("kid") == header.get("kid")
                if same_kid and key.get("alg", header.get("alg")) == header.get("alg"):
                    return jwt.PyJWK(key)
        raise SuspiciousOperation("No key of the provider signed this token.")

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        username = claims.get(settings.FLEET_OIDC_USERNAME_CLAIM)
        return bool(claims.get("sub")) and isinstance(username, str) and 0 < len(username) <= 150

    def describe_user_by_claims(self, claims: dict[str, Any]) -> str:
        return f"sub {claims.get('sub')!r}"

    def filter_users_by_claims(self, claims: dict[str, Any]) -> QuerySet[Any]:
        return self.UserModel.objects.filter(
            sso_identity__source=SsoSource.OIDC, sso_identity__subject=str(claims["sub"])
        )

    def create_user(self, claims: dict[str, Any]) -> Any:
        username = claims[settings.FLEET_OIDC_USERNAME_CLAIM]
        if self.UserModel.objects.filter(username__iexact=username).exists():
            raise SuspiciousOperation(f"a user named {username!r} exists and is not this identity")
        with transaction.atomic():  # no user without its identity
            user = self.UserModel.objects.create_user(username, email=claims.get("email") or "")
            return self._synced(user, claims)

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        if not sso_identity_claim(user=user, source=SsoSource.OIDC, subject=str(claims["sub"])):
            raise SuspiciousOperation("the user is bound to another identity")
        return self._synced(user, claims)

    def _synced(self, user: Any, claims: dict[str, Any]) -> Any:
        subject = str(claims["sub"])
        email = claims.get("email")
        if isinstance(email, str) and email != user.email:
            user.email = email[:254]
            user.save(update_fields=["email"])
        sso_user_sync(user=user, source=SsoSource.OIDC, subject=subject, groups=groups_of(claims))
        return user


def provider_logout_url(request: HttpRequest) -> str | None:
    """Where to send a browser signing out of Fleet so that the provider's session ends too
    (OpenID Connect RP-Initiated Logout 1.0): its ``end_session_endpoint`` with this session's ID
    token as ``id_token_hint`` and Fleet's sign-in page as ``post_logout_redirect_uri`` (to be
    registered with the provider). ``None`` when the session did not come from an OIDC sign-in,
    when ``FLEET_OIDC_PROVIDER_LOGOUT`` is off, or when the provider publishes no such endpoint
    or cannot be reached: then only Fleet's session ends. Read before the session is flushed."""
    id_token = request.session.get("oidc_id_token")
    if not (settings.FLEET_OIDC_ENABLED and settings.FLEET_OIDC_PROVIDER_LOGOUT and id_token):
        return None
    try:
        end_session = discovery.endpoint("end_session_endpoint")
    except ImproperlyConfigured as error:
        logger.info("OIDC sign-out at the provider skipped: %s", error)
        return None
    prepared = PreparedRequest()
    prepared.prepare_url(
        end_session,
        {
            "id_token_hint": id_token,
            "client_id": settings.OIDC_RP_CLIENT_ID,
            "post_logout_redirect_uri": request.build_absolute_uri(reverse("web:login")),
        },
    )
    return str(prepared.url)


def _enabled() -> None:
    if not settings.FLEET_OIDC_ENABLED:
        raise Http404("OIDC sign-in is not configured")


def _failure() -> HttpResponse:
    return HttpResponseRedirect(settings.LOGIN_REDIRECT_URL_FAILURE)


class OidcStartView(OIDCAuthenticationRequestView):  # type: ignore[misc]
    """``/oidc/authenticate/``: off to the provider's sign-in page."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, **kwargs: Any) -> None:
        View.__init__(self, **kwargs)  # the endpoint is read in get(), where failure is handled

    def get(self, request: HttpRequest) -> HttpResponse:
        _enabled()
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        try:
            self.OIDC_OP_AUTH_ENDPOINT = discovery.endpoint("authorization_endpoint")
        except ImproperlyConfigured as error:
            logger.warning("OIDC sign-in unavailable: %s", error)
            return _failure()
        response: HttpResponse = super().get(request)
        return response


class OidcCallbackView(OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """``/oidc/callback/``: the provider sends the browser back here with a code."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        _enabled()
        try:
            response: HttpResponse = super().get(request)
        except SuspiciousOperation as error:
            logger.warning("OIDC callback refused: %s", error)
            return _failure()
        return response


def sso_identity_of(subject: str) -> SsoIdentity | None:
    return (
        SsoIdentity.objects.select_related("user")
        .filter(source=SsoSource.OIDC, subject=subject)
        .first()
    )
