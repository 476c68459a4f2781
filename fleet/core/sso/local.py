"""Local accounts (user name and password in Fleet's database), which an admin can turn off
for everyone but one break-glass user (``FLEET_LOCAL_LOGIN=off``,
``FLEET_BREAK_GLASS_USER``)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.http import HttpRequest

logger = logging.getLogger(__name__)


def local_login_allowed(username: str | None) -> bool:
    if settings.FLEET_LOCAL_LOGIN:
        return True
    return bool(username) and username == settings.FLEET_BREAK_GLASS_USER


class LocalBackend(ModelBackend):
    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if not local_login_allowed(username):
            logger.info("local sign-in refused for %r: local accounts are off", username)
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
