"""OIDC back-channel logout (OpenID Connect Back-Channel Logout 1.0): the provider POSTs a
signed ``logout_token`` when a user's sessions end there (signed out everywhere, disabled,
deleted); Fleet then revokes that user's API tokens and ends their sessions and sockets.

Only tokens naming a ``sub`` are acted on: Fleet keeps no provider session ids (``sid``).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import jwt
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from requests import RequestException

from fleet.core.sso.oidc import OidcBackend, sso_identity_of
from fleet.core.sso.sync import sso_user_revoke

logger = logging.getLogger(__name__)

LOGOUT_EVENT = "http://schemas.openid.net/event/backchannel-logout"
MAX_TOKEN_CHARS = 16_384
MAX_AGE_SECONDS = 300


class LogoutTokenInvalid(Exception):
    pass


def logout_claims(token: str) -> dict[str, Any]:
    """The verified claims of a logout token (signature by the provider's keys, issuer,
    audience, event, age, no nonce), or :class:`LogoutTokenInvalid`."""
    backend = OidcBackend()
    try:
        key = backend.retrieve_matching_jwk(token)
        claims = backend.get_payload_data(token, key)
    except (SuspiciousOperation, ImproperlyConfigured, RequestException, jwt.PyJWTError) as e:
        raise LogoutTokenInvalid(f"signature not verified: {e}") from None
    if isinstance(claims, bytes | str):
        claims = json.loads(claims)
    audience = claims.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    events = claims.get("events")
    checks = {
        "iss": str(claims.get("iss", "")).rstrip("/") == settings.FLEET_OIDC_ISSUER,
        "aud": settings.OIDC_RP_CLIENT_ID in audiences,
        "events": isinstance(events, dict) and LOGOUT_EVENT in events,
        "nonce": "nonce" not in claims,
        "sub": isinstance(claims.get("sub"), str) and bool(claims["sub"]),
        "iat": abs(time.time() - float(claims.get("iat") or 0)) <= MAX_AGE_SECONDS,
    }
    failed = sorted(name for name, ok in checks.items() if not ok)
    if failed:
        raise LogoutTokenInvalid(f"claims refused: {', '.join(failed)}")
    return dict(claims)


def _refused(status: int, code: str, message: str) -> JsonResponse:
    response = JsonResponse({"code": code, "message": message, "details": {}}, status=status)
    response["Cache-Control"] = "no-store"
    return response


@csrf_exempt  # a server-to-server call, authenticated by the token's signature
@require_POST
def backchannel_logout(request: HttpRequest) -> HttpResponse:
    """``POST /oidc/backchannel-logout/`` with ``logout_token``: 200 when done (also for a
    user Fleet never saw), 400 for a token that does not verify, 404 when OIDC is off."""
    if not settings.FLEET_OIDC_ENABLED:
        return _refused(404, "sso.oidc_off", "OIDC sign-in is not configured.")
    token = request.POST.get("logout_token", "")
    if not token or len(token) > MAX_TOKEN_CHARS:
        return _refused(400, "sso.logout_token_missing", "POST a logout_token.")
    try:
        claims = logout_claims(token)
    except LogoutTokenInvalid as error:
        logger.warning("OIDC back-channel logout refused: %s", error)
        return _refused(400, "sso.logout_token_invalid", str(error))
    identity = sso_identity_of(claims["sub"])
    if identity is not None:
        sso_user_revoke(user=identity.user, reason="back-channel logout", disable=False)
    response = HttpResponse(status=200)
    response["Cache-Control"] = "no-store"
    return response
