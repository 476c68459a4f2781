"""``Authorization: Token <key>`` for users' scripts; agent tokens are handled by the agent API."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from fleet.core.models import ApiToken
from fleet.core.tokens import hash_token

USER_TOKEN_KIND = "fla"


class ApiTokenAuthentication(authentication.TokenAuthentication):
    keyword = "Token"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Invalid token header: expected 'Token <key>'.")
        try:
            key = header[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("Invalid token header.") from None
        if not key.startswith(f"{USER_TOKEN_KIND}_"):
            # Host-agent tokens are only valid on the agent endpoints.
            raise exceptions.AuthenticationFailed("Invalid token.")
        return self._lookup(key)

    def _lookup(self, key: str) -> tuple[Any, ApiToken]:
        # By the unique hash alone: rows issued before the prefix fix store an empty prefix.
        token = ApiToken.objects.select_related("user").filter(key_hash=hash_token(key)).first()
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid token.")
        now = timezone.now()
        if token.expired(now):
            raise exceptions.AuthenticationFailed("Token expired; create a new one.")
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token
