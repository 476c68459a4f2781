"""Who may see the dashboard: every page and fragment needs a signed-in user holding a role."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render

from fleet.core.roles import Role, role_of

View = TypeVar("View", bound=Callable[..., HttpResponseBase])


def no_access(request: HttpRequest, required: Role = Role.MEMBER) -> HttpResponse:
    """The 403 page: signed in, but the role does not open this page."""
    context = {"required": required.label, "role": role_of(request.user).label}
    return render(request, "web/no_access.html", context, status=403)


def role_required(required: Role) -> Callable[[View], View]:
    """Anonymous users go to the sign-in page; users below ``required`` get the 403 page."""

    def decorate(view: View) -> View:
        @wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if role_of(request.user) < required:
                return no_access(request, required)
            return view(request, *args, **kwargs)

        return cast(View, guarded)

    return decorate
