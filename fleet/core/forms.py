"""The sign-in forms of the dashboard and of the Django admin, refused while locked out."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from fleet.core import login_throttle
from fleet.core.http import client_address

logger = logging.getLogger(__name__)

LOCKED_CODE = "locked"
LOCKED_MESSAGE = "Too many failed attempts; try again in %(seconds)d s."


def _refuse_while_locked(form: AuthenticationForm) -> None:
    """Checked before the password, so a locked name or address learns nothing from a guess."""
    username = str(form.data.get("username", ""))[:150]
    address = client_address(form.request) if form.request is not None else ""
    wait = login_throttle.wait_seconds(username=username, address=address)
    if wait:
        logger.info("sign-in refused, locked out: %r from %r (%d s)", username[:64], address, wait)
        raise ValidationError(LOCKED_MESSAGE, code=LOCKED_CODE, params={"seconds": wait})


def locked_seconds(form: Any) -> int | None:
    """The wait a refused sign-in form reports, or ``None`` when it was not refused for that."""
    throttled = isinstance(form, ThrottledAuthenticationForm | ThrottledAdminAuthenticationForm)
    if not throttled or not form.is_bound:
        return None
    for error in form.errors.as_data().get(NON_FIELD_ERRORS, []):
        if error.code == LOCKED_CODE and error.params:
            return int(error.params["seconds"])
    return None


class ThrottledAuthenticationForm(AuthenticationForm):
    def clean(self) -> dict[str, Any]:
        _refuse_while_locked(self)
        return super().clean()


class ThrottledAdminAuthenticationForm(AdminAuthenticationForm):
    def clean(self) -> dict[str, Any]:
        _refuse_while_locked(self)
        return super().clean()
