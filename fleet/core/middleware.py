"""Response headers and statuses every page gets: the Content-Security-Policy, and 429 for a
sign-in refused while locked out."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils.deprecation import MiddlewareMixin

from fleet.core.forms import locked_seconds

CSP_HEADER = "Content-Security-Policy"


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """``settings.FLEET_CONTENT_SECURITY_POLICY`` on every response that does not set its own.

    The pages load scripts only from ``/static/`` (no inline script, no ``eval``), so an
    injected ``<script>`` or event handler does not run.
    """

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> Any:
        policy = settings.FLEET_CONTENT_SECURITY_POLICY
        if policy and CSP_HEADER not in response:
            response[CSP_HEADER] = policy
        return response


class LoginLockoutMiddleware(MiddlewareMixin):
    """A sign-in form refused while locked out (``/login/``, ``/admin/login/``) answers 429
    with ``Retry-After``; both render the form again, with the wait in its message."""

    def process_template_response(self, request: HttpRequest, response: Any) -> Any:
        wait = locked_seconds((response.context_data or {}).get("form"))
        if wait:
            response.status_code = 429
            response["Retry-After"] = str(wait)
        return response
